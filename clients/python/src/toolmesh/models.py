"""Typed views of the protocol's shapes, for callers who want them: the client itself returns
plain dicts (`ApprovalRequest.model_validate(client_reply["approval_request"])` gives the
model). Unknown members are kept, so a newer node's additions pass through."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

RiskLevel = Literal["low", "medium", "high", "critical"]
SideEffect = Literal[
    "workspace_write",
    "workspace_delete",
    "isolated_runtime_execution",
    "process_control",
    "network_egress",
]
ApprovalStatus = Literal["pending", "approved", "rejected", "expired", "used"]


class ApprovalRequest(BaseModel):
    """An approval (PROTOCOL.md "Risk and approval"); times are RFC 3339 UTC strings."""

    model_config = ConfigDict(extra="allow")

    id: str
    account: str
    session_id: Optional[str] = None
    invocation_id: Optional[str] = None
    tool_name: str
    risk_level: RiskLevel
    side_effects: list[str] = []
    arguments_sha256: str
    arguments_preview: Any = None
    status: ApprovalStatus
    created_at: str
    expires_at: str
    decided_by: Optional[str] = None
    decided_at: Optional[str] = None
    reason: Optional[str] = None
    arguments: Optional[dict[str, Any]] = None
    """Only in `approvals.get`: the exact arguments the hash covers."""


class RunEvent(BaseModel):
    """One event of a call (PROTOCOL.md "RunEvent"); `seq` counts from 0 without gaps."""

    model_config = ConfigDict(extra="allow")

    invocation_id: str
    seq: int
    kind: str
    at: str
    session_id: Optional[str] = None
    user_id: Optional[str] = None
    agent_id: Optional[str] = None
    tool: Optional[str] = None
    ok: Optional[bool] = None
    """`finished` only."""
    error: Optional[str] = None
    """`finished` only: the error code of a failed call."""
    duration_ms: Optional[float] = None
    """`finished` only."""
    data: Optional[str] = None
    """`stdout` and `stderr` only."""
