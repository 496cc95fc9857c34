"""toolmesh tools as Google ADK tools (`google.adk.tools.BaseTool`).

    tools = await toolmesh.adk.get_tools(client, include=["focused"])
    agent = Agent(name="workspace_agent", model="gemini-2.5-flash", tools=tools)

Each tool declares the gateway's name, description and input JSON Schema
(`FunctionDeclaration.parameters_json_schema`); `run_async` calls it through the gateway and
returns the ToolReply dict, which ADK hands to the model as the function response. An
`approval_required` reply comes back as it is unless `approve` is given (see
`toolmesh._catalog.invoke`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from google.adk.tools import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from ._catalog import Approve, CatalogError, Include, ToolSpec, invoke, specs

if TYPE_CHECKING:
    from .client import Client

__all__ = ["CatalogError", "ToolmeshTool", "get_tools"]


class ToolmeshTool(BaseTool):
    """A toolmesh tool as an ADK tool: declared with the gateway's schema, run through the
    gateway."""

    def __init__(self, client: "Client", spec: ToolSpec,
                 approve: Optional[Approve] = None) -> None:
        """The tool for `spec`, calling through `client`."""
        super().__init__(name=spec.name, description=spec.description,
                         custom_metadata={"toolmesh_group": spec.group,
                                          "toolmesh_risk_level": spec.risk_level})
        self.input_schema = spec.input_schema
        self._client = client
        self._approve = approve

    def _get_declaration(self) -> types.FunctionDeclaration:
        """The declaration the model sees: name, description, input JSON Schema."""
        return types.FunctionDeclaration(name=self.name, description=self.description,
                                         parameters_json_schema=self.input_schema)

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> dict:
        """Calls the tool and returns its ToolReply."""
        return await invoke(self._client, self.name, args, self._approve)


async def get_tools(client: "Client", include: Include = None, *,
                    approve: Optional[Approve] = None) -> list[ToolmeshTool]:
    """ADK tools for the tools `tool_dispatcher` lists for `include` (default: the `focused`
    profile); raises `CatalogError` when `include` selects nothing."""
    return [ToolmeshTool(client, spec, approve) for spec in await specs(client, include)]
