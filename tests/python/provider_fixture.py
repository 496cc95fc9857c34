"""A raw tool provider for toolmesh's own integration tests (tests/it/providers.rs,
tests/it/mcp.rs): a NATS micro service written on nats.py `nats.micro` directly, so that its
test tools can answer what a `toolmesh.Tool` never would (a body that is not JSON, a plain JSON
string, the micro service error headers). examples/provider.py is the provider to copy.

    target/venv/bin/python tests/python/provider_fixture.py --nats nats://127.0.0.1:4222 \
        --name tests --test-tools --record /tmp/record.jsonl

It prints `ready <name> <service id>` once its endpoints are registered.

Tools: `ticket_create` (medium, a JSON Schema with title and priority; `--no-ticket` leaves it
out), `--echo NAME` adds a low-risk tool echoing its arguments, and `--test-tools` adds `slow`
(waits `seconds` or until cancelled), `whoami` (answers the instance id), `fail_foreign` (an
error code outside the closed list), `fail_header` (a micro service error), `plain` (a JSON
string), `not_json` and `big` (`lines` lines of text).

Cancel: the gateway publishes `{"invocation_id", "account", "tool"}` on
`toolmesh.v1.providers.cancel.<service name>`; `slow` stops the call it runs under that id.
`--record FILE` appends every request and cancel received to FILE as JSON lines;
`--no-announce` leaves discovery to the gateways' polling.
"""

import argparse
import asyncio
import json
import os
import signal
import sys

import nats
from nats.micro import add_service

ANNOUNCE = "toolmesh.v1.providers.announce"


def cancel_subject(service: str) -> str:
    return f"toolmesh.v1.providers.cancel.{service}"


def tool(description, input_schema, risk_level, side_effects=(), **extra):
    """The `toolmesh.tool` metadata of one endpoint (PROTOCOL.md "Tool providers")."""
    meta = {
        "description": description,
        "input_schema": input_schema,
        "risk_level": risk_level,
        "side_effects": list(side_effects),
    }
    meta.update(extra)
    return {"toolmesh.tool": json.dumps(meta)}


TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "priority": {"type": "string", "enum": ["low", "normal", "high"]},
    },
    "required": ["title"],
    "additionalProperties": False,
}


class Provider:
    def __init__(self, service, record):
        self.service = service
        self.record_path = record
        self.running = {}  # invocation_id -> asyncio.Event set by a cancel
        self.tickets = 0

    def record(self, entry):
        if self.record_path:
            with open(self.record_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def body(self, req):
        call = json.loads(req.data)
        self.record({"kind": "request", "subject": req.subject, "body": call})
        return call

    async def ticket_create(self, req):
        call = self.body(req)
        args = call["arguments"]
        self.tickets += 1
        ticket = {
            "id": f"T-{self.tickets}",
            "title": args["title"],
            "priority": args.get("priority", "normal"),
            "opened_by": call.get("user_id") or call["account"],
        }
        await req.respond(json.dumps({"ok": True, "ticket": ticket}).encode())

    async def on_cancel(self, msg):
        body = json.loads(msg.data)
        self.record({"kind": "cancel", "body": body})
        event = self.running.get(body.get("invocation_id"))
        if event is not None:
            event.set()

    # --- tools for toolmesh's integration tests -------------------------------------------

    async def slow(self, req):
        call = self.body(req)
        cancelled = asyncio.Event()
        self.running[call["invocation_id"]] = cancelled
        try:
            await asyncio.wait_for(cancelled.wait(), call["arguments"].get("seconds", 60))
            self.record({"kind": "stopped", "invocation_id": call["invocation_id"]})
            answer = {"ok": False, "error": "cancelled", "error_message": "stopped on request"}
        except asyncio.TimeoutError:
            answer = {"ok": True, "slept": True}
        finally:
            self.running.pop(call["invocation_id"], None)
        await req.respond(json.dumps(answer).encode())

    async def whoami(self, req):
        self.body(req)
        await req.respond(json.dumps({"ok": True, "instance": self.instance_id}).encode())

    async def fail_foreign(self, req):
        self.body(req)
        answer = {"ok": False, "error": "db_down", "error_message": "the ticket database is down"}
        await req.respond(json.dumps(answer).encode())

    async def fail_header(self, req):
        self.body(req)
        await req.respond_error("503", "ticket quota exhausted")

    async def plain(self, req):
        self.body(req)
        await req.respond(b'"just a string"')

    async def not_json(self, req):
        self.body(req)
        await req.respond(b"<html>oops</html>")

    async def big(self, req):
        call = self.body(req)
        text = "".join(f"line {i}\n" for i in range(call["arguments"]["lines"]))
        await req.respond(json.dumps({"ok": True, "text": text}).encode())

    async def echo(self, req):
        call = self.body(req)
        await req.respond(json.dumps({"ok": True, "echo": call["arguments"]}).encode())


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default=os.environ.get("TOOLMESH_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--name", default="tickets", help="the service name")
    parser.add_argument("--record", help="append what arrives to this file (JSON lines)")
    parser.add_argument("--test-tools", action="store_true")
    parser.add_argument("--no-ticket", action="store_true", help="leave ticket_create out")
    parser.add_argument("--echo", action="append", default=[], metavar="NAME",
                        help="add a low-risk echo tool named NAME")
    parser.add_argument("--no-announce", action="store_true",
                        help="wait to be found by polling instead of announcing")
    opts = parser.parse_args()

    nc = await nats.connect(opts.nats)
    provider = Provider(opts.name, opts.record)
    service = await add_service(
        nc, name=opts.name, version="1.0.0", description="A ticket system, as toolmesh tools"
    )
    provider.instance_id = service.id
    if not opts.no_ticket:
        await service.add_endpoint(
            name="ticket_create",
            subject=f"providers.{opts.name}.ticket_create",
            handler=provider.ticket_create,
            metadata=tool("Open a ticket in the ticket system.", TICKET_SCHEMA, "medium",
                          ["network_egress"]),
        )
    obj = {"type": "object", "additionalProperties": False}
    for name in opts.echo:
        await service.add_endpoint(
            name=name, subject=f"providers.{opts.name}.{name}", handler=provider.echo,
            metadata=tool("Echo the arguments back.", {"type": "object"}, "low"),
        )
    if opts.test_tools:
        tests = {
            "slow": ({**obj, "properties": {"seconds": {"type": "number"}}}, "low"),
            "whoami": (obj, "low"),
            "fail_foreign": (obj, "low"),
            "fail_header": (obj, "low"),
            "plain": (obj, "low"),
            "not_json": (obj, "low"),
            "big": ({**obj, "properties": {"lines": {"type": "integer"}}, "required": ["lines"]}, "low"),
        }
        for name, (schema, risk) in tests.items():
            await service.add_endpoint(
                name=name, subject=f"providers.{opts.name}.{name}", handler=getattr(provider, name),
                metadata=tool(f"Test tool {name}.", schema, risk),
            )
    await nc.subscribe(cancel_subject(opts.name), cb=provider.on_cancel)
    await nc.flush()
    if not opts.no_announce:
        await nc.publish(ANNOUNCE, b"{}")
        await nc.flush()
    print(f"ready {opts.name} {service.id}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.stop()
    await nc.drain()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
