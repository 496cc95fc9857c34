"""toolmesh tools as LangChain tools (`langchain_core.tools.BaseTool`), for LangChain and
LangGraph agents.

    tools = await toolmesh.langchain.get_tools(client, include=["focused"])
    agent = create_react_agent(model, tools)

Each tool has the gateway's name, description and input JSON Schema (`args_schema` is that
schema as a dict) and runs only asynchronously (`ainvoke`). Invoked with its arguments it
returns the ToolReply dict; invoked with a tool call (as LangGraph's `ToolNode` does) it returns
a `ToolMessage` whose content is the reply's JSON text and whose `artifact` is the reply dict.
An `approval_required` reply comes back as it is unless `approve` is given (see
`toolmesh._catalog.invoke`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Optional

from langchain_core.tools import BaseTool
from pydantic import PrivateAttr

from ._catalog import Approve, CatalogError, Include, ToolSpec, invoke, specs

if TYPE_CHECKING:
    from .client import Client

__all__ = ["ToolmeshTool", "get_tools", "CatalogError"]


class ToolmeshTool(BaseTool):
    """A toolmesh tool as a LangChain tool, run (asynchronously only) through the gateway."""

    args_schema: dict
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    _client: Any = PrivateAttr()
    _approve: Optional[Approve] = PrivateAttr(default=None)

    @classmethod
    def of(cls, client: "Client", spec: ToolSpec,
           approve: Optional[Approve] = None) -> "ToolmeshTool":
        """The tool for `spec`, calling through `client`."""
        tool = cls(name=spec.name, description=spec.description, args_schema=spec.input_schema,
                   metadata={"toolmesh_group": spec.group,
                             "toolmesh_risk_level": spec.risk_level})
        tool._client = client
        tool._approve = approve
        return tool

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        """Refuses: toolmesh tools run only asynchronously."""
        raise NotImplementedError(f"{self.name} is a toolmesh tool: use ainvoke, not invoke")

    async def _arun(self, **arguments: Any) -> tuple[dict, dict]:
        """Calls the tool; the reply is both the content and the artifact."""
        reply = await invoke(self._client, self.name, arguments, self._approve)
        return reply, reply


async def get_tools(client: "Client", include: Include = None, *,
                    approve: Optional[Approve] = None) -> list[ToolmeshTool]:
    """LangChain tools for the tools `tool_dispatcher` lists for `include` (default: the
    `focused` profile); raises `CatalogError` when `include` selects nothing."""
    return [ToolmeshTool.of(client, spec, approve) for spec in await specs(client, include)]
