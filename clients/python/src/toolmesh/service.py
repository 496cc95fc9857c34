"""`serve`: Python tools as a toolmesh tool provider (PROTOCOL.md "Tool providers").

Each `Tool` becomes an endpoint of one nats.py micro service, on the subject
`providers.<service>.<tool>`, with its definition in `metadata["toolmesh.tool"]`. The service
announces itself on `toolmesh.v1.providers.announce` (at start and after a reconnect) so
gateways find it at once, and listens on `toolmesh.v1.providers.cancel.<service>` to set
`ctx.cancelled` of the call named.

What a call answers:

* `ToolOk(output)` → `{"ok": true, "output": output}` (with `message`, `brief` if not empty);
* `ToolError(message, output, brief)` → `{"ok": false, "error": "provider_error",
  "error_message": message, "output": output, "brief": brief}`;
* an exception → `provider_error` whose message is the exception's type and text; the
  traceback goes to the `toolmesh` logger, never into the reply;
* arguments the pydantic model refuses → `invalid_arguments` with `details` as the gateway
  gives them (`[{"path": "/member", "message"}]`). The gateway checked the JSON Schema
  already, so this happens only for checks the schema cannot express (validators);
* a body that is not a call → `invalid_request`.

Each call runs in its own task, so a slow call never holds up another.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Iterable, Optional, Sequence

from nats.micro import add_service
from pydantic import BaseModel, ValidationError

from . import ids
from ._nats import AwaitableContext, Link, Urls, resolve_urls
from .tools import Tool, ToolContext, ToolError, ToolOk, check_tool

log = logging.getLogger("toolmesh")

ANNOUNCE_SUBJECT = "toolmesh.v1.providers.announce"
DEFAULT_SUBJECT_PREFIX = "providers"
STOP_GRACE_S = 5.0
"""How long `stop` lets running calls finish after setting their `ctx.cancelled`."""
RESERVED_PREFIXES = ("toolmesh.", "_INBOX.", "$")


def serve(
    tools: Iterable[Tool],
    *,
    service: str,
    url: Urls = None,
    version: str = "0.1.0",
    description: Optional[str] = None,
    subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    **nats_options: Any,
) -> AwaitableContext["ToolService"]:
    """Serves `tools` on the mesh as the provider `service`; returns the running `ToolService`.

        service = await toolmesh.serve([TicketCreate()], service="tickets")
        await service.wait()          # until service.stop() or cancellation

    or `async with toolmesh.serve(...) as service:` (stopped at the end of the block).

    Args:
        tools: `Tool` instances; names must be unique.
        service: the service name (`[A-Za-z0-9_-]{1,64}`): the `execution` of its tools is
            `provider:<service>`, its cancels come on `toolmesh.v1.providers.cancel.<service>`.
        url: NATS server URL(s), comma-separated or a list; default `TOOLMESH_NATS_URL`, then
            `nats://127.0.0.1:4222`.
        version: the service's semantic version.
        description: the service's description (default: names its tools).
        subject_prefix: endpoints listen on `<subject_prefix>.<service>.<tool>`; not under
            `toolmesh.`, `_INBOX.` or `$`, which the gateway refuses.
        **nats_options: passed to `nats.connect`; the defaults are the client's, except that
            a provider reconnects without limit (`max_reconnect_attempts=-1`).

    Raises:
        ValueError, TypeError: a bad tool definition, a duplicate name, a bad service name
            or subject prefix.
        TransportError: no NATS server answers.
    """
    servers = resolve_urls(url)
    tools = list(tools)
    ids.check_token(service, "service")
    for tool in tools:
        check_tool(tool)
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"tool names must be unique; repeated: {', '.join(duplicates)}")
    if not tools:
        raise ValueError("serve needs at least one tool")
    check_subject_prefix(subject_prefix)

    async def make() -> ToolService:
        link = Link()
        await link.connect(servers, -1, nats_options)
        running = ToolService(link, service, tools, subject_prefix)
        try:
            await running._start(version, description)
        except BaseException:
            await link.close()
            raise
        return running

    return AwaitableContext(make, ToolService.stop)


def check_subject_prefix(prefix: str) -> None:
    """Raises `ValueError` for a prefix the gateway would refuse or NATS cannot subscribe."""
    tokens = prefix.split(".") if isinstance(prefix, str) else []
    if (not tokens or any(not t or any(c in t for c in " \t*>") for t in tokens)
            or (prefix + ".").startswith(RESERVED_PREFIXES)):
        raise ValueError(
            f"subject_prefix must be literal subject tokens, not under toolmesh., _INBOX. or $; "
            f"got {prefix!r}"
        )


class ToolService:
    """A running provider (what `serve` returns). `stop()` ends it; `wait()` returns once it
    stopped; `async with` stops it at the end of the block."""

    def __init__(self, link: Link, name: str, tools: Sequence[Tool], subject_prefix: str) -> None:
        self._link = link
        self.name = name
        self.tools = {t.name: t for t in tools}
        self.subject_prefix = subject_prefix
        self._service: Any = None
        self._cancel_sub: Any = None
        self._calls: dict[str, ToolContext] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()

    @property
    def id(self) -> str:
        """The micro service instance id (`$SRV.INFO`'s `id`)."""
        return str(self._service.id)

    @property
    def nats(self) -> Any:
        """The underlying nats-py connection."""
        return self._link.nc

    def subject(self, tool: str) -> str:
        """The endpoint subject of `tool`."""
        return f"{self.subject_prefix}.{self.name}.{tool}"

    async def _start(self, version: str, description: Optional[str]) -> None:
        nc = self._link.nc
        self._service = await add_service(
            nc, name=self.name, version=version,
            description=description or f"toolmesh tools: {', '.join(self.tools)}",
        )
        for tool in self.tools.values():
            await self._service.add_endpoint(
                name=tool.name,
                subject=self.subject(tool.name),
                handler=self._handler(tool),
                metadata={"toolmesh.tool": json.dumps(tool.metadata())},
            )
        self._cancel_sub = await nc.subscribe(
            f"toolmesh.v1.providers.cancel.{self.name}", cb=self._on_cancel)
        await nc.flush()
        await self.announce()
        self._link.on_reconnect = self.announce

    async def announce(self) -> None:
        """Tells gateways to look for providers now (they also find it within 5 s)."""
        nc = self._link.nc
        await nc.publish(ANNOUNCE_SUBJECT, json.dumps({"service": self.name, "id": self.id}).encode())
        await nc.flush()

    def _handler(self, tool: Tool) -> Any:
        async def handle(request: Any) -> None:
            task = asyncio.ensure_future(self._answer(tool, request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return handle

    async def _answer(self, tool: Tool, request: Any) -> None:
        ctx: Optional[ToolContext] = None
        try:
            try:
                call = json.loads(request.data)
                if not isinstance(call, dict) or not isinstance(call.get("invocation_id"), str):
                    raise ValueError("not a call")
                arguments = call.get("arguments")
                if arguments is None:
                    arguments = {}
            except ValueError:
                reply = failure("invalid_request", f"the body sent to {tool.name} is not a toolmesh call")
            else:
                ctx = ToolContext(
                    invocation_id=call["invocation_id"],
                    account=str(call.get("account") or ""),
                    session_id=call.get("session_id"),
                    user_id=call.get("user_id"),
                    agent_id=call.get("agent_id"),
                    tool=tool.name,
                )
                self._calls[ctx.invocation_id] = ctx
                reply = await run_tool(tool, arguments, ctx)
        except Exception as e:  # a bug here must still answer
            log.exception("toolmesh: answering a call of %s failed", tool.name)
            reply = failure("internal", f"the provider failed to answer ({type(e).__name__})")
        finally:
            if ctx is not None and self._calls.get(ctx.invocation_id) is ctx:
                del self._calls[ctx.invocation_id]
        try:
            await request.respond(encode(reply, tool.name))
        except Exception:
            log.warning("toolmesh: cannot send the reply of %s", tool.name, exc_info=True)

    async def _on_cancel(self, msg: Any) -> None:
        try:
            body = json.loads(msg.data)
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        ctx = self._calls.get(str(body.get("invocation_id")))
        if ctx is not None and body.get("account") in (None, ctx.account):
            ctx.cancelled.set()

    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stops taking calls, sets `ctx.cancelled` of those running, lets them answer for up
        to `grace` seconds, cancels the rest and closes the connection."""
        if self._stopped.is_set():
            return
        try:
            if self._service is not None:
                await self._service.stop()
            if self._cancel_sub is not None:
                await self._cancel_sub.unsubscribe()
        except Exception:  # the connection may be gone already
            log.debug("toolmesh: stopping %s", self.name, exc_info=True)
        for ctx in list(self._calls.values()):
            ctx.cancelled.set()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
        await self._link.close()
        self._stopped.set()

    async def wait(self) -> None:
        """Returns once the service stopped (`stop()`); cancelling the waiter stops it."""
        try:
            await self._stopped.wait()
        except asyncio.CancelledError:
            await asyncio.shield(self.stop())
            raise

    async def __aenter__(self) -> "ToolService":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def run_tool(tool: Tool, arguments: Any, ctx: ToolContext) -> dict[str, Any]:
    """Runs `tool` on `arguments` and gives its answer as a reply body; never raises."""
    try:
        params = tool.params.model_validate(arguments)
    except ValidationError as e:
        return failure(
            "invalid_arguments",
            f"arguments of {tool.name} are not valid: {e.error_count()} error(s)",
            details=[{"path": pointer(err.get("loc", ())), "message": err.get("msg", "")}
                     for err in e.errors()],
        )
    try:
        result = await tool(params, ctx)
    except Exception as e:
        log.exception("toolmesh: tool %s raised", tool.name)
        return failure("provider_error", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
    if isinstance(result, ToolOk):
        body: dict[str, Any] = {"ok": True, "output": jsonable(result.output)}
        if result.message:
            body["message"] = result.message
        if result.brief:
            body["brief"] = result.brief
        return body
    if isinstance(result, ToolError):
        return failure("provider_error", str(result.message),
                       output=jsonable(result.output), brief=result.brief)
    return failure("provider_error",
                   f"tool {tool.name} returned {type(result).__name__}, not ToolOk or ToolError")


def failure(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"ok": False, "error": code, "error_message": message, **details}


def jsonable(value: Any) -> Any:
    """Pydantic models as their JSON form; everything else as it is."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def encode(reply: dict[str, Any], tool: str) -> bytes:
    """The reply as JSON; an output JSON cannot hold becomes a `provider_error`."""
    try:
        return json.dumps(reply).encode()
    except (TypeError, ValueError) as e:
        return json.dumps(failure(
            "provider_error", f"the output of {tool} is not JSON: {type(e).__name__}: {e}")).encode()


def pointer(loc: Iterable[Any]) -> str:
    """A pydantic error location as a JSON pointer (`("a", 0)` → `/a/0`)."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in loc]
    return "/" + "/".join(parts) if parts else ""
