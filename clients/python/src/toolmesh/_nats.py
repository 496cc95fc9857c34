"""The NATS connection the client and `serve` share: fast failure at connect, reconnects
afterwards, and requests that fail at once when the connection drops.

Connect defaults (each overridable through `**nats_options`):

* `connect_timeout=2` seconds per attempt;
* `reconnect_time_wait=1` second between attempts;
* the first connect tries each server of `url` twice, then raises `TransportError` (so a dead
  server fails within a few seconds, whatever `max_reconnect_attempts` says);
* `inbox_prefix` from `TOOLMESH_NATS_INBOX_PREFIX` when set (a NATS user allowed only a
  private inbox, like the compose cluster's account users, names it there, as for the CLI);
* after that, `max_reconnect_attempts` (default 10 for a client, unlimited for `serve`; `-1`
  is unlimited) governs reconnecting; `allow_reconnect=False` turns reconnecting off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Any, Awaitable, Callable, Generator, Generic, Optional, Sequence, TypeVar, Union

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from .errors import TransportError

log = logging.getLogger("toolmesh")

DEFAULT_URL = "nats://127.0.0.1:4222"
URL_VAR = "TOOLMESH_NATS_URL"
INBOX_PREFIX_VAR = "TOOLMESH_NATS_INBOX_PREFIX"
CONNECT_TIMEOUT_S = 2
RECONNECT_TIME_WAIT_S = 1
CLIENT_MAX_RECONNECT_ATTEMPTS = 10
# Each server of the URL list is tried this many times by the first connect.
FIRST_CONNECT_ATTEMPTS = 2

T = TypeVar("T")


Urls = Union[str, Sequence[str], None]


def resolve_urls(url: Urls) -> list[str]:
    """The servers of `url` (comma-separated, or a list), else of `TOOLMESH_NATS_URL`, else
    `nats://127.0.0.1:4222`."""
    if url is None or url == "":
        url = os.environ.get(URL_VAR) or DEFAULT_URL
    items = url.split(",") if isinstance(url, str) else list(url)
    servers = [u.strip() for u in items if isinstance(u, str) and u.strip()]
    if not servers or len(servers) != len(items):
        raise ValueError(f"url must name NATS servers (nats://host:port, comma-separated); got {url!r}")
    return servers


def redact(url: str) -> str:
    """`url` without its userinfo (user, password or token)."""
    return re.sub(r"//[^/@]*@", "//***@", url)


class Link:
    """A NATS connection that knows when it is down: `request` fails at once when the
    connection is not up, and a request in flight fails as soon as the connection drops
    (NATS core delivers at most once, so its reply would be lost anyway)."""

    def __init__(self) -> None:
        self.nc: NatsClient = NatsClient()
        self._lost = asyncio.Event()
        self._user_callbacks: dict[str, Optional[Callable[..., Awaitable[None]]]] = {}
        self.on_reconnect: Optional[Callable[[], Awaitable[None]]] = None

    async def connect(self, url: Urls, max_reconnect_attempts: int,
                      nats_options: dict[str, Any]) -> None:
        """Connects to `url` (see the module docs for the defaults); `TransportError` when no
        server of it answers."""
        servers = resolve_urls(url)
        options = dict(nats_options)
        wanted_attempts = options.pop("max_reconnect_attempts", max_reconnect_attempts)
        for name in ("disconnected_cb", "reconnected_cb", "closed_cb"):
            self._user_callbacks[name] = options.pop(name, None)
        options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        options.setdefault("reconnect_time_wait", RECONNECT_TIME_WAIT_S)
        options.setdefault("allow_reconnect", True)
        options.setdefault("error_cb", _log_error)
        if os.environ.get(INBOX_PREFIX_VAR):
            options.setdefault("inbox_prefix", os.environ[INBOX_PREFIX_VAR])
        try:
            await self.nc.connect(
                servers,
                max_reconnect_attempts=FIRST_CONNECT_ATTEMPTS - 1,
                disconnected_cb=self._disconnected,
                reconnected_cb=self._reconnected,
                closed_cb=self._closed,
                **options,
            )
        except Exception as e:  # nats-py raises OSError, its own errors and timeouts here
            shown = ", ".join(redact(u) for u in servers)
            raise TransportError(f"cannot connect to NATS at {shown}: {_describe(e)}") from e
        # `options` is nats-py's public settings dict, read again on every reconnect.
        self.nc.options["max_reconnect_attempts"] = wanted_attempts

    async def _disconnected(self) -> None:
        self._lost.set()
        await self._user("disconnected_cb")

    async def _reconnected(self) -> None:
        self._lost = asyncio.Event()
        await self._user("reconnected_cb")
        if self.on_reconnect is not None:
            await self.on_reconnect()

    async def _closed(self) -> None:
        self._lost.set()
        await self._user("closed_cb")

    async def _user(self, name: str) -> None:
        callback = self._user_callbacks.get(name)
        if callback is not None:
            await callback()

    def _check_up(self) -> asyncio.Event:
        """The event that fires when the current connection is lost; `TransportError` when
        there is no connection now."""
        if self.nc.is_closed:
            raise TransportError("the NATS connection is closed")
        if not self.nc.is_connected:
            raise TransportError("the NATS connection is down (reconnecting)")
        return self._lost

    async def request(self, subject: str, payload: bytes, timeout: float) -> Msg:
        """A request; `TransportError` on no responders, a timeout or a lost connection."""
        lost = self._check_up()
        sent = asyncio.ensure_future(self.nc.request(subject, payload, timeout=timeout))
        dropped = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({sent, dropped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
            if not sent.done():
                sent.cancel()
        if not sent.done() or sent.cancelled():
            raise TransportError(f"the NATS connection was lost while waiting for a reply on {subject}")
        try:
            return sent.result()
        except nats.errors.NoRespondersError as e:
            raise TransportError(f"nothing answers on {subject}: is a toolmesh node running?") from e
        except nats.errors.TimeoutError as e:
            raise TransportError(f"no reply on {subject} within {timeout:g} s") from e
        except (nats.errors.Error, OSError) as e:
            raise TransportError(f"request on {subject} failed: {_describe(e)}") from e

    async def wait_lost(self) -> None:
        """Returns when the current connection is lost (at once when it is down)."""
        await self._check_up().wait()

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()


async def _log_error(e: Exception) -> None:
    log.debug("nats: %s", _describe(e))


def _describe(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class AwaitableContext(Generic[T]):
    """What `connect` and `serve` return: await it for the object, or use it with `async with`
    to have it closed at the end of the block."""

    def __init__(self, make: Callable[[], Awaitable[T]], close: Callable[[T], Awaitable[None]]) -> None:
        self._make = make
        self._close = close
        self._value: Optional[T] = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._value = await self._make()
        return self._value

    async def __aexit__(self, *exc: object) -> None:
        if self._value is not None:
            await self._close(self._value)
