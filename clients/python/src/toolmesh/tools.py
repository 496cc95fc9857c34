"""Tools written in Python: a `Tool` subclass per tool, its arguments a pydantic model, put on
the mesh by `toolmesh.serve([MyTool()], service="…")`. The package README ("Serve tools") and
`examples/provider.py` show a whole one.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Sequence, Union

from pydantic import BaseModel

from . import ids

RISK_LEVELS = ("low", "medium", "high", "critical")
SIDE_EFFECTS = (
    "workspace_write",
    "workspace_delete",
    "isolated_runtime_execution",
    "process_control",
    "network_egress",
)


@dataclass
class ToolOk:
    """A tool's success: answers `{"ok": true, "output": output}` (plus `message` and
    `brief` when not empty). `output` is anything JSON can hold, or a pydantic model."""

    output: Any = ""
    message: str = ""
    brief: str = ""


@dataclass
class ToolError:
    """A tool's failure: answers `{"ok": false, "error": "provider_error", "error_message":
    message, "output": output, "brief": brief}`."""

    message: str
    output: Any = ""
    brief: str = ""


ToolResult = Union[ToolOk, ToolError]


@dataclass
class ToolContext:
    """What a call of a tool knows besides its arguments.

    `cancelled` is set when the call is cancelled (`toolmesh.v1.cancel`, the gateway's
    deadline, or the service stopping): a long tool waits on it or checks `is_set()`.
    """

    invocation_id: str
    account: str
    session_id: Optional[str] = None
    user_id: Optional[str] = None
    agent_id: Optional[str] = None
    tool: str = ""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class Tool:
    """Base class of a tool served with `toolmesh.serve`.

    A subclass sets these class attributes and defines `async def __call__(self, params,
    ctx)` returning `ToolOk` or `ToolError`:

    * `name`: `[A-Za-z0-9_-]{1,64}`, unique on the mesh;
    * `description`: what the tool does, for people and models;
    * `params`: a pydantic model; its JSON Schema (`input_schema()`) is the tool's input
      schema, which the gateway checks every call against;
    * `risk_level`: `low`, `medium`, `high` or `critical` (the approval gate uses it);
    * `side_effects`: words from `workspace_write`, `workspace_delete`,
      `isolated_runtime_execution`, `process_control`, `network_egress` (default none);
    * `group` (default: the gateway's `external`);
    * `needs_session` (default False; True makes the gateway require a `session_id`).

    Construction checks all of them and raises `ValueError` or `TypeError` naming the tool.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    params: ClassVar[type[BaseModel]]
    risk_level: ClassVar[str]
    side_effects: ClassVar[Sequence[str]] = ()
    group: ClassVar[Optional[str]] = None
    needs_session: ClassVar[bool] = False

    def __init__(self) -> None:
        check_tool(self)

    async def __call__(self, params: Any, ctx: ToolContext) -> ToolResult:
        raise NotImplementedError(f"tool {self.name} defines no __call__")

    @classmethod
    def input_schema(cls) -> dict[str, Any]:
        """The JSON Schema of `params`, self-contained (local `$ref`s inlined)."""
        return clean_schema(cls.params.model_json_schema())

    def metadata(self) -> dict[str, Any]:
        """The endpoint's `toolmesh.tool` metadata (PROTOCOL.md "Tool providers")."""
        meta: dict[str, Any] = {
            "description": self.description,
            "input_schema": self.input_schema(),
            "risk_level": self.risk_level,
            "side_effects": list(self.side_effects),
            "needs_session": bool(self.needs_session),
        }
        if self.group:
            meta["group"] = self.group
        return meta


def check_tool(tool: object) -> None:
    """Raises `ValueError` or `TypeError` naming what is wrong with `tool`'s definition."""
    if not isinstance(tool, Tool):
        raise TypeError(f"a tool is an instance of a toolmesh.Tool subclass; got {tool!r}")
    cls = type(tool).__name__
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not ids.TOKEN.fullmatch(name):
        raise ValueError(f"{cls}.name must be 1 to 64 characters of A-Z, a-z, 0-9, _ and -; got {name!r}")
    description = getattr(tool, "description", None)
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"tool {name}: description must be a non-empty string")
    params = getattr(tool, "params", None)
    if not (isinstance(params, type) and issubclass(params, BaseModel)):
        raise TypeError(f"tool {name}: params must be a pydantic BaseModel subclass; got {params!r}")
    risk = getattr(tool, "risk_level", None)
    if risk not in RISK_LEVELS:
        raise ValueError(f"tool {name}: risk_level must be one of {', '.join(RISK_LEVELS)}; got {risk!r}")
    effects = tool.side_effects
    if isinstance(effects, str) or not all(e in SIDE_EFFECTS for e in effects):
        raise ValueError(
            f"tool {name}: side_effects must be a list of words from {', '.join(SIDE_EFFECTS)}; "
            f"got {effects!r}"
        )
    if tool.group is not None and (not isinstance(tool.group, str) or not tool.group):
        raise ValueError(f"tool {name}: group must be a non-empty string or None; got {tool.group!r}")
    if not isinstance(tool.needs_session, bool):
        raise ValueError(f"tool {name}: needs_session must be True or False")
    if not inspect.iscoroutinefunction(type(tool).__call__):
        raise TypeError(f"tool {name}: __call__ must be `async def __call__(self, params, ctx)`")
    if type(tool).__call__ is Tool.__call__:
        raise TypeError(f"tool {name}: define `async def __call__(self, params, ctx)`")
    schema = tool.input_schema()
    if schema.get("type") != "object":
        raise ValueError(f"tool {name}: params must describe a JSON object")
    json.dumps(schema)


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every local `$ref` (`#/$defs/…`) replaced by its definition and the
    top-level `title` dropped (the gateway titles a schema with the tool's name). A recursive
    model keeps its `$defs`, which a JSON Schema validator resolves."""
    schema = copy.deepcopy(schema)
    defs = schema.pop("$defs", {})
    recursive = False

    def inline(node: Any, seen: tuple[str, ...]) -> Any:
        nonlocal recursive
        if isinstance(node, list):
            return [inline(n, seen) for n in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            key = ref[len("#/$defs/"):]
            if key in seen or key not in defs:
                recursive = True
                return node
            rest = {k: v for k, v in node.items() if k != "$ref"}
            target = inline(defs[key], seen + (key,))
            return {**target, **{k: inline(v, seen) for k, v in rest.items()}}
        return {k: inline(v, seen) for k, v in node.items()}

    out = inline(schema, ())
    if recursive:
        out["$defs"] = defs
    out.pop("title", None)
    return out
