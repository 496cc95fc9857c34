"""toolmesh for Python: call tools on the mesh, and serve tools written in Python.

    import toolmesh

    async with toolmesh.connect(account="acme", session="s-42") as client:
        reply = await client.call("read_workspace_file", {"path": "notes.md"})

The contract is the repository's docs/PROTOCOL.md ("Clients: Python, agent frameworks,
OAuth"). Framework adapters live in `toolmesh.langchain`, `toolmesh.adk` and
`toolmesh.openai_agents` (extras of the same names).
"""

from .client import Approvals, Client, EventStream, connect
from .errors import ToolmeshError, TransportError
from .ids import new_invocation_id
from .models import ApprovalRequest, RunEvent
from .service import ToolService, serve
from .tools import Tool, ToolContext, ToolError, ToolOk, ToolResult

__version__ = "0.1.0"

__all__ = [
    "ApprovalRequest",
    "Approvals",
    "Client",
    "EventStream",
    "RunEvent",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOk",
    "ToolResult",
    "ToolService",
    "ToolmeshError",
    "TransportError",
    "connect",
    "new_invocation_id",
    "serve",
]
