"""The toolmesh client: tool calls, approvals, RunEvents and cancel over NATS.

    async with toolmesh.connect(account="acme", session="s-42") as client:
        reply = await client.call("read_workspace_file", {"path": "notes.md"})

Calls return the ToolReply dict whatever its `ok`; management requests (approvals, cancel)
raise `ToolmeshError` on `ok: false`; anything that gets no reply raises `TransportError`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any, AsyncIterator, Mapping, Optional, Union

from . import ids
from ._nats import CLIENT_MAX_RECONNECT_ATTEMPTS, AwaitableContext, Link, Urls, resolve_urls
from .errors import ToolmeshError, TransportError

DEFAULT_CALL_TIMEOUT_S = 130.0
"""How long `call` waits for a reply when not told: the gateway waits 120 s for the actor
running a tool, so its own `timeout` reply comes first."""

TOOL_TIMEOUT_MARGIN_S = 40.0
"""Added to a tool's own `timeout` argument (seconds): the gateway waits that argument plus
30 s, so again its reply comes first."""

DEFAULT_REQUEST_TIMEOUT_S = 10.0
"""How long approvals and cancel requests wait for a reply."""

EVENT_REORDER_S = 0.5
"""How long `events` holds an event back while an earlier `seq` may still arrive."""

MAX_WAIT_FOR_APPROVAL_S = 3600

Approval = Union[str, Mapping[str, Any]]


def connect(
    url: Urls = None,
    *,
    account: str,
    session: Optional[str] = None,
    user_id: Optional[str] = None,
    agent_id: Optional[str] = None,
    **nats_options: Any,
) -> AwaitableContext["Client"]:
    """Connects to the mesh as `account`.

    `client = await toolmesh.connect(...)`, or `async with toolmesh.connect(...) as client:`
    to have it closed at the end of the block.

    Args:
        url: NATS server URL(s), comma-separated or a list; default `TOOLMESH_NATS_URL`,
            then `nats://127.0.0.1:4222`.
        account: the account every request acts for (`[A-Za-z0-9_-]{1,64}`).
        session: the session id sent with every call (`[A-Za-z0-9_-]{1,64}`); workspace and
            sandbox tools need one.
        user_id, agent_id: copied into every call, its events and its traces.
        **nats_options: passed to `nats.connect` (`user_credentials`, `tls`,
            `inbox_prefix`, …). Defaults: `connect_timeout=2`, `reconnect_time_wait=1`,
            `allow_reconnect=True`, `max_reconnect_attempts=10` (after the first connect,
            which tries each server twice and then raises).

    Raises:
        ValueError: `account`, `session` or `url` has another syntax.
        TransportError: no NATS server answers.
    """
    servers = resolve_urls(url)
    ids.check_token(account, "account")
    if session is not None:
        ids.check_token(session, "session")
    for name, value in (("user_id", user_id), ("agent_id", agent_id)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string; got {value!r}")

    async def make() -> Client:
        link = Link()
        await link.connect(servers, CLIENT_MAX_RECONNECT_ATTEMPTS, nats_options)
        return Client(link, account=account, session=session, user_id=user_id,
                      agent_id=agent_id)

    return AwaitableContext(make, Client.close)


class Client:
    """A connection to the mesh acting for one account (and optionally one session).

    Made by `toolmesh.connect`. `request_timeout` (seconds, default 10) bounds approvals and
    cancel requests. Usable as `async with client:` (closed at the end).
    """

    def __init__(self, link: Link, *, account: str, session: Optional[str],
                 user_id: Optional[str], agent_id: Optional[str]) -> None:
        self._link = link
        self.account = account
        self.session = session
        self.user_id = user_id
        self.agent_id = agent_id
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT_S
        self.approvals = Approvals(self)

    @property
    def nats(self) -> Any:
        """The underlying nats-py connection."""
        return self._link.nc

    @staticmethod
    def new_invocation_id() -> str:
        """A fresh invocation id: pass it to `events` and then to `call`."""
        return ids.new_invocation_id()

    async def call(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        approval: Optional[Approval] = None,
        wait_for_approval_s: Optional[int] = None,
        invocation_id: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> dict[str, Any]:
        """Calls `tool` and returns its ToolReply as a dict, whatever its `ok`.

        Args:
            tool: the tool's name.
            arguments: the tool's arguments (default `{}`).
            approval: an approval id, or `{"id"?, "approved"?}` (PROTOCOL.md "Risk and
                approval"): `"appr_…"` repeats a call someone approved.
            wait_for_approval_s: 0 to 3600; a call that needs an approval is held that long
                for a decision instead of answering `approval_required`.
            invocation_id: the call's id (default: the gateway makes one); give one to watch
                the call's `events` or `cancel` it.
            timeout: seconds to wait for the reply. Default: 130 s (the gateway's 120 s wait
                for a tool, plus a margin), or the tool's own `timeout` argument plus 40 s
                when that is larger, plus `wait_for_approval_s`. A given `timeout` must
                exceed `wait_for_approval_s`.

        Raises:
            ValueError: a malformed `invocation_id`, `wait_for_approval_s`, `approval` or
                `timeout`.
            TransportError: no reply (no gateway, a timeout, the connection lost).
        """
        if not isinstance(tool, str) or not tool:
            raise ValueError(f"tool must be a non-empty string; got {tool!r}")
        body: dict[str, Any] = {"tool": tool, "arguments": dict(arguments or {})}
        for name, value in (("session_id", self.session), ("user_id", self.user_id),
                            ("agent_id", self.agent_id)):
            if value is not None:
                body[name] = value
        if invocation_id is not None:
            body["invocation_id"] = ids.check_invocation_id(invocation_id)
        if approval is not None:
            body["approval"] = _approval(approval)
        wait = 0
        if wait_for_approval_s is not None:
            if (isinstance(wait_for_approval_s, bool) or not isinstance(wait_for_approval_s, int)
                    or not 0 <= wait_for_approval_s <= MAX_WAIT_FOR_APPROVAL_S):
                raise ValueError(
                    f"wait_for_approval_s must be an integer from 0 to {MAX_WAIT_FOR_APPROVAL_S}; "
                    f"got {wait_for_approval_s!r}"
                )
            wait = wait_for_approval_s
            body["wait_for_approval_s"] = wait
        if timeout is None:
            timeout = call_timeout(body["arguments"], wait)
        elif not _positive(timeout) or timeout <= wait:
            raise ValueError(
                f"timeout must be a number of seconds above wait_for_approval_s ({wait}); "
                f"got {timeout!r}"
            )
        return await self._request(f"toolmesh.v1.call.{self.account}", body, timeout)

    async def cancel(self, invocation_id: str) -> bool:
        """Cancels a running call of this account: `True` when it stopped one, `False` when
        no call of that id runs (finished, unknown, or another account's).

        Raises:
            ValueError: a malformed id.
            ToolmeshError: the node refused the request.
            TransportError: no reply.
        """
        body = {"invocation_id": ids.check_invocation_id(invocation_id)}
        reply = await self._management(f"toolmesh.v1.cancel.{self.account}", body)
        return bool(reply.get("cancelled"))

    def events(self, invocation_id: str) -> "EventStream":
        """The RunEvents of one call, in `seq` order, up to and including `finished`.

        Subscribe before the call starts, or the first events are gone (NATS core keeps
        nothing):

            inv = client.new_invocation_id()
            async with client.events(inv) as events:
                reply = await client.call("tool", args, invocation_id=inv)
                async for event in events:
                    ...

        Events that arrive while the call runs wait in the stream. Iterating without
        `async with` subscribes at the first `__anext__`, which suits a call that is
        already waiting (for an approval, say) and misses what came before.

        Raises (while iterating):
            TransportError: the connection was lost.
        """
        return EventStream(self, ids.check_invocation_id(invocation_id))

    async def close(self) -> None:
        """Closes the connection; calls still waiting raise `TransportError`."""
        await self._link.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _request(self, subject: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        payload = json.dumps(body).encode()
        msg = await self._link.request(subject, payload, timeout)
        try:
            reply = json.loads(msg.data)
        except ValueError as e:
            raise TransportError(f"the reply on {subject} is not JSON: {msg.data[:200]!r}") from e
        if not isinstance(reply, dict):
            raise TransportError(f"the reply on {subject} is not a JSON object: {msg.data[:200]!r}")
        return reply

    async def _management(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        """A request whose `ok: false` raises `ToolmeshError`."""
        reply = await self._request(subject, body, self.request_timeout)
        if reply.get("ok") is not True:
            raise ToolmeshError.from_reply(reply)
        return reply


class Approvals:
    """The account's approvals (`client.approvals`). Each method returns the ApprovalRequest
    dicts of the reply and raises `ToolmeshError` on `ok: false` (`not_found`, `conflict`,
    `approval_expired`, `forbidden`, …) and `TransportError` without a reply."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _subject(self, verb: str) -> str:
        return f"toolmesh.v1.approvals.{self._client.account}.{verb}"

    async def list(self) -> list[dict[str, Any]]:
        """The account's pending approvals."""
        reply = await self._client._management(self._subject("list"), {})
        return list(reply.get("approvals") or [])

    async def get(self, id: str) -> dict[str, Any]:
        """One approval, whatever its status, with the exact `arguments` it covers (and
        `arguments_truncated: true` when they were too large to keep), which the reply carries
        beside the approval, merged into it.

        Raises `ToolmeshError` with code `not_found` for an id this account does not have."""
        reply = await self._client._management(self._subject("get"), {"id": _approval_id(id)})
        approval = dict(reply["approval"])
        for extra in ("arguments", "arguments_truncated", "arguments_bytes"):
            if extra in reply:
                approval.setdefault(extra, reply[extra])
        return approval

    async def decide(self, id: str, approved: bool, *, approver: Optional[str] = None,
                     reason: Optional[str] = None) -> dict[str, Any]:
        """Approves (`approved=True`) or rejects an approval; returns it as decided.

        Repeating the same decision returns it again; the contrary one raises
        `ToolmeshError` with code `conflict`, an expired one `approval_expired`.
        """
        if not isinstance(approved, bool):
            raise ValueError(f"approved must be True or False; got {approved!r}")
        body: dict[str, Any] = {"id": _approval_id(id), "approved": approved}
        if approver is not None:
            body["approver"] = approver
        if reason is not None:
            body["reason"] = reason
        reply = await self._client._management(self._subject("decide"), body)
        return dict(reply["approval"])


class EventStream:
    """The RunEvents of one invocation (`client.events(invocation_id)`), as dicts in `seq`
    order, ending after `finished`.

    NATS may deliver events of different publishers out of order: one that arrives ahead of
    an earlier `seq` is held up to 0.5 s for the missing ones, then given anyway.
    """

    def __init__(self, client: Client, invocation_id: str) -> None:
        self._client = client
        self.invocation_id = invocation_id
        self._subject = f"toolmesh.v1.events.{client.account}.{invocation_id}"
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._sub: Any = None
        self._held: dict[int, dict[str, Any]] = {}
        self._held_since: Optional[float] = None
        self._next_seq = 0
        self._done = False

    async def subscribe(self) -> "EventStream":
        """Subscribes and waits until the server has the subscription (once; `async with`
        and the first iteration call it)."""
        if self._sub is None:
            link = self._client._link
            link._check_up()
            try:
                self._sub = await link.nc.subscribe(self._subject, cb=self._received)
                await link.nc.flush(timeout=self._client.request_timeout)
            except Exception as e:
                raise TransportError(f"cannot subscribe to {self._subject}: {e}") from e
        return self

    async def close(self) -> None:
        """Unsubscribes (safe to call twice)."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is gone: nothing to undo
                pass

    async def _received(self, msg: Any) -> None:
        try:
            event = json.loads(msg.data)
        except ValueError:
            return
        if isinstance(event, dict) and isinstance(event.get("seq"), int):
            self._queue.put_nowait(event)

    async def __aenter__(self) -> "EventStream":
        return await self.subscribe()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._done:
            await self.close()
            raise StopAsyncIteration
        await self.subscribe()
        while True:
            ready = self._take()
            if ready is not None:
                if ready.get("kind") == "finished":
                    self._done = True
                return ready
            wait: Optional[float] = None
            if self._held_since is not None:
                wait = max(0.0, self._held_since + EVENT_REORDER_S - time.monotonic())
            event = await self._next(wait)
            if event is None:
                self._skip_gap()
                continue
            if event["seq"] >= self._next_seq and event["seq"] not in self._held:
                self._held[event["seq"]] = event
                if self._held_since is None:
                    self._held_since = time.monotonic()

    def _take(self) -> Optional[dict[str, Any]]:
        """The next event in order, if it is here."""
        event = self._held.pop(self._next_seq, None)
        if event is None:
            return None
        self._next_seq += 1
        self._held_since = time.monotonic() if self._held else None
        return event

    def _skip_gap(self) -> None:
        """Gives up on missing events: continue at the lowest held `seq`."""
        if self._held:
            self._next_seq = min(self._held)

    async def _next(self, wait: Optional[float]) -> Optional[dict[str, Any]]:
        """The next event received, or None after `wait` seconds; `TransportError` when the
        connection is lost first."""
        if not self._queue.empty():
            return self._queue.get_nowait()
        got = asyncio.ensure_future(self._queue.get())
        lost = asyncio.ensure_future(self._client._link.wait_lost())
        try:
            done, _ = await asyncio.wait({got, lost}, timeout=wait,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not got.done():
                got.cancel()
        if got in done:
            return got.result()
        if lost in done:
            lost_error = lost.exception() if not lost.cancelled() else None
            raise TransportError(
                f"the NATS connection was lost while waiting for events of {self.invocation_id}"
            ) from lost_error
        return None


def call_timeout(arguments: Mapping[str, Any], wait_for_approval_s: int) -> float:
    """The default reply timeout of a call (see `Client.call`)."""
    timeout = DEFAULT_CALL_TIMEOUT_S
    own = arguments.get("timeout")
    if _positive(own):
        timeout = max(timeout, float(own) + TOOL_TIMEOUT_MARGIN_S)
    return timeout + wait_for_approval_s


def _positive(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def _approval(approval: Approval) -> dict[str, Any]:
    if isinstance(approval, str):
        return {"id": _approval_id(approval)}
    if isinstance(approval, Mapping):
        out = dict(approval)
        if "approved" in out and not isinstance(out["approved"], bool):
            raise ValueError(f"approval['approved'] must be True or False; got {out['approved']!r}")
        return out
    raise ValueError(f"approval must be an approval id or a mapping; got {approval!r}")


def _approval_id(id: object) -> str:
    if not isinstance(id, str) or not id:
        raise ValueError(f"an approval id is a non-empty string; got {id!r}")
    return id
