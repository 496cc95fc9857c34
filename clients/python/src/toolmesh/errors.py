"""The exceptions the package raises.

`TransportError`: the request never got an answer (no NATS server, no responders, a timeout, the
connection lost while waiting). `ToolmeshError`: a management request (approvals, cancel)
answered `ok: false`; it carries the reply's `code` and `message`. A tool call never raises
`ToolmeshError`: its failures are ToolReply dicts.
"""

from __future__ import annotations

from typing import Any, Optional


class TransportError(Exception):
    """A request got no reply: NATS unreachable, no responders, a timeout, or the connection
    went away while waiting. The NATS error, when there is one, is `__cause__`."""


class ToolmeshError(Exception):
    """A management request answered `{"ok": false, "error": code, "error_message": message}`.

    `code` is the protocol's error code (`not_found`, `conflict`, `approval_expired`,
    `forbidden`, `invalid_request`, …), `message` its sentence and `reply` the whole reply.
    """

    def __init__(self, code: str, message: str, reply: Optional[dict[str, Any]] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply: dict[str, Any] = reply or {}

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "ToolmeshError":
        """The error a failure reply stands for."""
        code = str(reply.get("error") or "internal")
        message = str(reply.get("error_message") or "the reply says ok: false without a message")
        return cls(code, message, reply)
