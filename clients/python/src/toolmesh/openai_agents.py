"""toolmesh tools as OpenAI Agents SDK tools (`agents.FunctionTool`).

    tools = await toolmesh.openai_agents.get_tools(client, include=["focused"])
    agent = Agent(name="workspace_agent", instructions="…", tools=tools)

Each tool has the gateway's name, description and input JSON Schema (`params_json_schema`,
not strict: the gateway's schemas have optional members, and the gateway validates every call);
`on_invoke_tool` calls it through the gateway and returns the ToolReply's JSON text. Arguments
that are not a JSON object never reach the gateway: they answer an `invalid_arguments` reply
of the same shape. An `approval_required` reply comes back as it is unless `approve` is given
(see `toolmesh._catalog.invoke`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

from agents import FunctionTool
from agents.tool_context import ToolContext

from ._catalog import Approve, CatalogError, Include, ToolSpec, invoke, specs, to_json

if TYPE_CHECKING:
    from .client import Client

__all__ = ["CatalogError", "get_tools", "tool"]


def tool(client: "Client", spec: ToolSpec, approve: Optional[Approve] = None) -> FunctionTool:
    """The `FunctionTool` for `spec`, calling through `client`."""

    async def on_invoke_tool(ctx: ToolContext[Any], args_json: str) -> str:
        arguments = parse_arguments(args_json)
        if isinstance(arguments, str):
            return to_json({"ok": False, "error": "invalid_arguments",
                            "error_message": arguments,
                            "details": [{"path": "", "message": arguments}]})
        return to_json(await invoke(client, spec.name, arguments, approve))

    return FunctionTool(name=spec.name, description=spec.description,
                        params_json_schema=spec.input_schema, on_invoke_tool=on_invoke_tool,
                        strict_json_schema=False)


def parse_arguments(text: Optional[str]) -> dict | str:
    """The arguments object in a model's JSON text (empty text is `{}`), or why there is none."""
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"the arguments are not JSON: {e}"
    if not isinstance(value, dict):
        return f"the arguments are a JSON {type(value).__name__}, not an object"
    return value


async def get_tools(client: "Client", include: Include = None, *,
                    approve: Optional[Approve] = None) -> list[FunctionTool]:
    """Agents SDK tools for the tools `tool_dispatcher` lists for `include` (default: the
    `focused` profile); raises `CatalogError` when `include` selects nothing."""
    return [tool(client, spec, approve) for spec in await specs(client, include)]
