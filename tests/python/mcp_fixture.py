"""A small MCP server for the bridge's tests (tests/it/bridge.rs), written with the official
Python SDK. Over stdio by default; `--http PORT` serves streamable HTTP on 127.0.0.1:PORT/mcp
(`--http 0`: on a port the system picks), and writes the port to $FIXTURE_STATE_DIR/port once it
listens.

Tools: `echo` (read-only), `fail` (answers isError), `sleep` (medium: waits, records in
$FIXTURE_STATE_DIR that it started and whether it was cancelled), `add_tool` (registers a
tool and sends notifications/tools/list_changed). At start it writes its pid to
$FIXTURE_STATE_DIR/pid.
"""

import argparse
import asyncio
import os
import pathlib
import socket

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

STATE = pathlib.Path(os.environ.get("FIXTURE_STATE_DIR", "."))
server = MCPServer("toolmesh-fixture")


def record(name: str, text: str = "") -> None:
    tmp = STATE / (name + ".tmp")
    tmp.write_text(text)
    tmp.rename(STATE / name)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Answer the text given."""
    return text


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def fail(message: str) -> str:
    """Fail with the message given (an isError result)."""
    raise ToolError(message)


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
async def sleep(seconds: float, tag: str = "sleep") -> str:
    """Wait, then answer."""
    record(tag + ".started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record(tag + ".cancelled")
        raise
    return "slept"


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Register a tool `name` (it echoes) and tell the client the tool list changed."""

    def added(text: str) -> str:
        return text

    server.add_tool(added, name=name, description="A tool added at run time.",
                    annotations=ToolAnnotations(readOnlyHint=True))
    await ctx.session.send_tool_list_changed()
    return "added " + name


async def serve_http(port: int) -> None:
    """What `server.run("streamable-http")` serves, on a socket bound here: its port is known
    (and written to $FIXTURE_STATE_DIR/port) before the first client comes."""
    sock = socket.create_server(("127.0.0.1", port))
    record("port", str(sock.getsockname()[1]))
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level=server.settings.log_level.lower())
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int)
    args = parser.parse_args()
    record("pid", str(os.getpid()))
    if args.http is not None:
        anyio.run(serve_http, args.http)
    else:
        server.run()
