"""Transport failures raise `TransportError`, soon: a dead server, no responders, a timeout, a
server that goes away mid-session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.errors
import pytest

import toolmesh
from support import ClosedPort, NatsServer

# A bound on how long each failure may take to surface: generous, it catches a hang (nats-py's
# default reconnect loop takes minutes), not slowness.
WITHIN = 10.0


@pytest.fixture
def lone_nats(tmp_path: Path):
    """A nats-server of the test's own, with no toolmesh node."""
    server = NatsServer.start(tmp_path / "nats")
    yield server
    server.stop()


async def test_connecting_where_nothing_listens_fails_fast() -> None:
    port = ClosedPort()
    try:
        with pytest.raises(toolmesh.TransportError) as raised:
            await asyncio.wait_for(
                toolmesh.connect(f"nats://127.0.0.1:{port.port}", account="acme"), WITHIN)
    finally:
        port.close()
    assert raised.value.__cause__ is not None
    assert str(port.port) in str(raised.value)


async def test_a_call_nobody_answers_raises(lone_nats: NatsServer) -> None:
    async with toolmesh.connect(lone_nats.url, account="acme") as client:
        with pytest.raises(toolmesh.TransportError) as raised:
            await asyncio.wait_for(client.call("workspace_status"), WITHIN)
    assert isinstance(raised.value.__cause__, nats.errors.NoRespondersError)


async def silent_gateway(url: str):
    """A connection subscribed to acme's call subject that never answers, and its
    subscription (`next_msg` tells when a call arrived)."""
    nc = await nats.connect(url)
    sub = await nc.subscribe("toolmesh.v1.call.acme")
    await nc.flush()
    return nc, sub


async def test_a_call_without_a_reply_times_out(lone_nats: NatsServer) -> None:
    silent, _ = await silent_gateway(lone_nats.url)
    try:
        async with toolmesh.connect(lone_nats.url, account="acme") as client:
            with pytest.raises(toolmesh.TransportError) as raised:
                await asyncio.wait_for(client.call("workspace_status", timeout=0.5), WITHIN)
    finally:
        await silent.close()
    assert isinstance(raised.value.__cause__, nats.errors.TimeoutError)


async def test_a_server_going_away_fails_calls_in_flight_and_after(lone_nats: NatsServer) -> None:
    silent, calls = await silent_gateway(lone_nats.url)
    client = await toolmesh.connect(lone_nats.url, account="acme")
    try:
        inv = client.new_invocation_id()
        events = await client.events(inv).subscribe()
        waiting = asyncio.ensure_future(client.call("workspace_status", timeout=120))
        listening = asyncio.ensure_future(events.__anext__())
        await calls.next_msg(timeout=WITHIN)
        lone_nats.process.kill()
        with pytest.raises(toolmesh.TransportError, match="lost"):
            await asyncio.wait_for(waiting, WITHIN)
        with pytest.raises(toolmesh.TransportError, match="lost"):
            await asyncio.wait_for(listening, WITHIN)
        with pytest.raises(toolmesh.TransportError):
            await asyncio.wait_for(client.call("workspace_status"), WITHIN)
        with pytest.raises(toolmesh.TransportError):
            await asyncio.wait_for(client.approvals.list(), WITHIN)
    finally:
        await client.close()
        await silent.close()


async def test_the_url_may_list_several_servers(node) -> None:
    dead = ClosedPort()
    try:
        urls = f"nats://127.0.0.1:{dead.port}, {node.nats_url}"
        async with toolmesh.connect(urls, account=node.account) as client:
            assert (await client.call("tool_search", {"query": "file"}))["ok"] is True
    finally:
        dead.close()


async def test_the_url_defaults_to_toolmesh_nats_url(node, monkeypatch) -> None:
    monkeypatch.setenv("TOOLMESH_NATS_URL", node.nats_url)
    async with toolmesh.connect(account=node.account) as client:
        assert client.nats.connected_url.port == int(node.nats_url.rsplit(":", 1)[1])


async def test_the_inbox_prefix_defaults_to_toolmesh_nats_inbox_prefix(node, monkeypatch) -> None:
    """Replies come to the inbox prefix the environment names, as for the CLI: a user allowed
    only a private inbox (the compose cluster's account users) connects without options."""
    monkeypatch.setenv("TOOLMESH_NATS_INBOX_PREFIX", "_INBOX.pytest_private")
    sniffer = await nats.connect(node.nats_url)
    seen = []

    async def record(msg) -> None:
        seen.append(msg)

    try:
        await sniffer.subscribe("_INBOX.pytest_private.>", cb=record)
        await sniffer.flush()
        async with toolmesh.connect(node.nats_url, account=node.account) as client:
            reply = await client.call("tool_search", {"query": "file"})
        assert reply["ok"] is True
        await sniffer.flush()
        assert any(reply["invocation_id"].encode() in msg.data for msg in seen), seen
    finally:
        await sniffer.close()


async def test_a_connect_error_does_not_show_the_password() -> None:
    port = ClosedPort()
    try:
        with pytest.raises(toolmesh.TransportError) as raised:
            await asyncio.wait_for(toolmesh.connect(
                f"nats://alice:hunter2@127.0.0.1:{port.port}", account="acme"), WITHIN)
    finally:
        port.close()
    assert "hunter2" not in str(raised.value) and "alice" not in str(raised.value)
    assert f"nats://***@127.0.0.1:{port.port}" in str(raised.value)
