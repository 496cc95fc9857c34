"""Fixtures: one real toolmesh node for the session, a connected client per test.

`node` starts nats-server (JetStream), redis-server and `toolmesh node` (the binary at
`TOOLMESH_BIN`, default `target/debug/toolmesh`) with the roles gateway, approval and workspace
in strict approval mode, waits until the node answers `toolmesh.v1.status.<node_id>`, and stops
all three when the session ends. `client` is a `toolmesh.Client` of `node.account` with a fresh
session id, closed after its test.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

import toolmesh
from support import NatsServer, RedisServer, ToolmeshNode, temp_dir

ACCOUNT = "acme"
ROLES = "gateway,approval,workspace"


@dataclass
class NodeInfo:
    """What tests know of the session's node."""

    nats_url: str
    account: str
    data_dir: Path
    node_id: str


@pytest.fixture(scope="session")
def node() -> Iterator[NodeInfo]:
    """A toolmesh node (gateway, approval, workspace; strict approval) on its own servers."""
    dir = temp_dir("toolmesh-pytest-")
    nats_server = NatsServer.start(dir / "nats")
    redis_server = None
    started = None
    try:
        redis_server = RedisServer.start(dir / "redis")
        started = ToolmeshNode.start(
            nats_server.url, redis_server.url, dir / "node", ROLES, ACCOUNT,
            env={"TOOLMESH_TOOL_APPROVAL_MODE": "strict"},
        )
        yield NodeInfo(nats_url=nats_server.url, account=ACCOUNT,
                       data_dir=started.data_dir, node_id=started.node_id)
    finally:
        if started is not None:
            started.stop()
        if redis_server is not None:
            redis_server.stop()
        nats_server.stop()
        shutil.rmtree(dir, ignore_errors=True)


def new_session() -> str:
    """A fresh random session id."""
    return "s-" + uuid.uuid4().hex[:16]


@pytest.fixture
async def client(node: NodeInfo) -> AsyncIterator[toolmesh.Client]:
    """A client of `node.account` in a fresh session, closed after the test."""
    c = await toolmesh.connect(node.nats_url, account=node.account, session=new_session(),
                               user_id="u-pytest", agent_id="a-pytest")
    try:
        yield c
    finally:
        await c.close()
