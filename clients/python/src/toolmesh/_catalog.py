"""What the framework adapters share: the tools `tool_dispatcher` offers, and calling one.

`specs` asks the gateway (one `list`, then a `describe` per tool, concurrently) and gives a
`ToolSpec` per tool; `invoke` calls a tool through the client and returns its ToolReply. The
adapters (`toolmesh.langchain`, `toolmesh.adk`, `toolmesh.openai_agents`) hold only the glue
that turns a `ToolSpec` into their framework's tool object.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Optional, Union

from .errors import ToolmeshError

if TYPE_CHECKING:
    from .client import Client

DISPATCHER = "tool_dispatcher"
DISPATCHER_NAMES = (DISPATCHER, "agentengine_tool_dispatcher")
DEFAULT_INCLUDE = ("focused",)

Include = Union[str, Iterable[str], None]
"""Groups, profiles and tool names, one string (comma-separated) or several."""

Approve = Callable[[dict], Union[Optional[bool], Awaitable[Optional[bool]]]]
"""Decides an approval request: `True` goes on with it, `False` rejects it, `None` leaves it
pending (see `invoke`)."""

# `tool_dispatcher` is never in what it lists or describes, so its spec is written here, after
# the gateway's `ToolDispatcher` arguments (PROTOCOL.md, "Tools", Dispatcher); the gateway
# validates every call against its own schema all the same.
DISPATCHER_DESCRIPTION = (
    "List, describe and call built-in tools by name, so that only the tools needed are loaded "
    "into context. Calls go through the same approval policy."
)
DISPATCHER_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": ["list", "describe", "call"],
            "description": "`list`, `describe` or `call`.",
        },
        "tool_name": {
            "type": ["string", "null"],
            "description": "The tool to describe or call.",
        },
        "arguments": {
            "type": ["object", "string", "null"],
            "description": "The called tool's arguments: an object, or a string holding a JSON "
                           "object.",
        },
        "include": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "null"},
            ],
            "description": "Groups, profiles and tool names to choose from (instead of "
                           "`profile`).",
        },
        "profile": {
            "type": "string",
            "enum": ["focused", "core", "default", "coding"],
            "default": "default",
            "description": "The tool set to choose from when `include` is not given.",
        },
    },
    "required": ["action"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the gateway describes it."""

    name: str
    description: str
    input_schema: dict
    group: str = ""
    risk_level: str = ""


class CatalogError(ToolmeshError, ValueError):
    """`include` selects no tool, or `tool_dispatcher` refuses to list or describe what it
    names (`code` is then the reply's, `invalid_arguments` for an unknown include item)."""


def include_items(include: Include) -> list[str]:
    """The items of `include`: `None` is the `focused` profile, a string splits at commas."""
    if include is None:
        return list(DEFAULT_INCLUDE)
    if isinstance(include, str):
        items = include.split(",")
    else:
        items = list(include)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"include items are strings, got {type(item).__name__}")
        item = item.strip()
        if item and item not in out:
            out.append(item)
    if not out:
        raise CatalogError("invalid_arguments",
                           "include names nothing; pass None for the focused profile")
    return out


def dispatcher_spec(name: str = DISPATCHER) -> ToolSpec:
    """The spec of `tool_dispatcher` (or its alias), which `list` never gives."""
    return ToolSpec(name=name, description=DISPATCHER_DESCRIPTION,
                    input_schema=DISPATCHER_SCHEMA, group="dispatcher", risk_level="low")


async def specs(client: "Client", include: Include = None) -> list[ToolSpec]:
    """The specs of the tools `tool_dispatcher` `list` gives for `include`, in its order.

    A dispatcher name in `include` (`tool_dispatcher`, `agentengine_tool_dispatcher`) adds the
    dispatcher itself, last. Raises `CatalogError` when an item is no group, profile or tool,
    or when `include` selects no tool at all.
    """
    items = include_items(include)
    dispatchers = [i for i in items if i in DISPATCHER_NAMES]
    rest = [i for i in items if i not in DISPATCHER_NAMES]
    out: list[ToolSpec] = []
    if rest:
        listed = await _ask(client, {"action": "list", "include": rest})
        names = [t["name"] for t in listed.get("tools", [])]
        described = await asyncio.gather(
            *(_ask(client, {"action": "describe", "tool_name": n, "include": rest})
              for n in names)
        )
        for reply in described:
            tool = reply["tool"]
            out.append(ToolSpec(name=tool["name"], description=tool.get("description", ""),
                                input_schema=tool.get("input_schema") or {"type": "object"},
                                group=tool.get("group", ""),
                                risk_level=tool.get("risk_level", "")))
    if dispatchers:
        out.append(dispatcher_spec(dispatchers[0]))
    if not out:
        raise CatalogError("invalid_arguments", f"include {items!r} selects no tool")
    return out


async def _ask(client: "Client", arguments: dict) -> dict:
    """One `tool_dispatcher` request; a failure reply raises `CatalogError`."""
    reply = await client.call(DISPATCHER, arguments)
    if not reply.get("ok"):
        details = "; ".join(f"{d.get('path', '')}: {d.get('message', '')}"
                            for d in reply.get("details") or [])
        message = reply.get("error_message") or "no message"
        raise CatalogError(
            str(reply.get("error") or "internal"),
            f"tool_dispatcher {arguments['action']} refused: {message}"
            + (f" ({details})" if details else ""),
            reply,
        )
    return reply


async def invoke(client: "Client", name: str, arguments: Optional[dict],
                 approve: Optional[Approve] = None) -> dict:
    """Calls tool `name` through the gateway and returns its ToolReply, whatever its `ok`.

    Without `approve`, an `approval_required` reply comes back as it is. With it, `approve`
    gets the reply's `approval_request` (and may wait, e.g. for a person's decision):
    `None` returns the `approval_required` reply; `False` rejects the approval; `True`
    approves it unless it is decided already (someone decided it meanwhile, e.g. with
    `toolmesh approvals approve`). Both then repeat the call with the approval, answering the
    tool's reply or `approval_rejected`. A decision the approval service refuses
    (`forbidden`, `conflict`, …) returns its failure reply.
    """
    arguments = arguments or {}
    reply = await client.call(name, arguments)
    if approve is None or reply.get("error") != "approval_required":
        return reply
    request = reply.get("approval_request") or {}
    verdict = approve(request)
    if inspect.isawaitable(verdict):
        verdict = await verdict
    if verdict is None:
        return reply
    try:
        if not verdict or (await client.approvals.get(request["id"]))["status"] == "pending":
            await client.approvals.decide(request["id"], bool(verdict))
    except ToolmeshError as e:
        return e.reply
    return await client.call(name, arguments, approval={"id": request["id"]})


def to_json(reply: Any) -> str:
    """The reply as JSON text, non-ASCII kept."""
    return json.dumps(reply, ensure_ascii=False)
