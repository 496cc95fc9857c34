"""A toolmesh tool provider in Python: one `toolmesh.Tool`, served with `toolmesh.serve`.

Run it next to a toolmesh cluster and its tool `ticket_create` is in tool_search,
tool_dispatcher and the call subject of every gateway within a few seconds:

    target/venv/bin/python examples/provider.py            # TOOLMESH_NATS_URL or nats://127.0.0.1:4222
    toolmesh call ticket_create --account acme --args '{"title": "Printer on fire"}'

(`pip install ./clients/python` installs the `toolmesh` package elsewhere.)

`ticket_create` takes its arguments as a pydantic model, whose JSON Schema the gateway checks
every call against before the provider sees anything, and has risk `medium`, so in strict mode
it needs an approval. It answers `{"ok": true, "output": {"id", "title", "priority",
"opened_by"}}`; a ticket system that is down would answer `ToolError`, which callers get as
`provider_error`.

Cancel: when a running call is cancelled, its `ctx.cancelled` (an `asyncio.Event`) is set; a
slow tool waits on it or checks it.
"""

import argparse
import asyncio
import itertools
import os
import signal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import toolmesh


class Params(BaseModel):
    """The arguments of ticket_create."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, max_length=200, description="What is wrong, in one line.")
    priority: Literal["low", "normal", "high"] = Field(
        default="normal", description="How soon someone should look."
    )


class TicketCreate(toolmesh.Tool):
    name = "ticket_create"
    description = "Open a ticket in the ticket system."
    params = Params
    risk_level = "medium"
    side_effects = ["network_egress"]

    def __init__(self) -> None:
        super().__init__()
        self.numbers = itertools.count(1)

    async def __call__(self, params: Params, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        ticket = {
            "id": f"T-{next(self.numbers)}",
            "title": params.title,
            "priority": params.priority,
            "opened_by": ctx.user_id or ctx.account,
        }
        return toolmesh.ToolOk(output=ticket)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default=os.environ.get("TOOLMESH_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--name", default="tickets", help="the service name")
    opts = parser.parse_args()

    service = await toolmesh.serve(
        [TicketCreate()], service=opts.name, url=opts.nats, version="1.0.0",
        description="A ticket system, as toolmesh tools",
    )
    print(f"ready {opts.name} {service.id}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(service.stop()))
    await service.wait()


if __name__ == "__main__":
    asyncio.run(main())
