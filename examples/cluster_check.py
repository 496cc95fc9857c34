#!/usr/bin/env python3
"""Drives the compose cluster through the public protocol and asserts what issue 6 asks of it.

    python3 examples/cluster_check.py check [--only NAME,…]   # the checks (scripts/cluster-test)
    python3 examples/cluster_check.py bench --concurrency 8 --seconds 20

It needs nats-py, a running cluster (compose.yml, with `docker-compose` and the project name in
COMPOSE_PROJECT_NAME), and the passwords of docker/nats.conf (the defaults, or the
TOOLMESH_NATS_*_PASSWORD variables). Every check prints what it saw; the first failed
assertion stops the run with exit code 1. Faults are made with the docker CLI (kill, stop,
restart) on the containers the cluster reports as its nodes: a node's id is
`<hostname>-<suffix>`, and a sandbox worker's hostname is its container id.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

import nats
from nats.errors import TimeoutError as NatsTimeout

URL = os.environ.get("TOOLMESH_CLIENT_URL", "nats://127.0.0.1:4222")
PASSWORDS = {
    "toolmesh": os.environ.get("TOOLMESH_NATS_NODE_PASSWORD", "toolmesh-node-secret"),
    "acme": os.environ.get("TOOLMESH_NATS_ACME_PASSWORD", "acme-secret"),
    "globex": os.environ.get("TOOLMESH_NATS_GLOBEX_PASSWORD", "globex-secret"),
    "approver": os.environ.get("TOOLMESH_NATS_APPROVER_PASSWORD", "approver-secret"),
    "provider": os.environ.get("TOOLMESH_NATS_PROVIDER_PASSWORD", "provider-secret"),
}
COMPOSE = os.environ.get("COMPOSE", "docker-compose").split()
T0 = time.monotonic()


class CheckFailed(Exception):
    pass


def log(*parts):
    print(f"[{time.monotonic() - T0:7.1f}s]", *parts, flush=True)


def expect(cond, what, detail=None):
    if not cond:
        raise CheckFailed(what + (f": {json.dumps(detail)[:1500]}" if detail is not None else ""))
    log("  ok:", what)


def sh(*args, check=True):
    """Runs a command (docker, docker-compose); returns its stdout."""
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise CheckFailed(f"{' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return out.stdout.strip()


def compose(*args, check=True):
    return sh(*COMPOSE, *args, check=check)


class Conn:
    """One NATS connection as one user (to `servers`, or URL), with the errors the server sent
    it and how long each reconnection took (`gaps`, seconds)."""

    def __init__(self, user, servers=None):
        self.user = user
        self.servers = servers or [URL]
        self.errors = []
        self.gaps = []
        self.lost_at = None
        self.nc = None

    async def open(self):
        async def on_error(e):
            self.errors.append(str(e))

        async def disconnected():
            self.lost_at = time.monotonic()

        async def reconnected():
            if self.lost_at is not None:
                self.gaps.append(time.monotonic() - self.lost_at)
                self.lost_at = None

        inbox = "_INBOX" if self.user == "toolmesh" else f"_INBOX.{self.user}"
        self.nc = await nats.connect(
            servers=self.servers,
            user=self.user,
            password=PASSWORDS[self.user],
            inbox_prefix=inbox,
            name=f"cluster-check-{self.user}",
            error_cb=on_error,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2 if len(self.servers) > 1 else 0.5,
        )
        return self

    async def request(self, subject, body, timeout=60.0):
        msg = await self.nc.request(subject, json.dumps(body).encode(), timeout=timeout)
        return json.loads(msg.data)

    async def call(self, account, tool, args=None, session=None, approval=None, timeout=150.0, **extra):
        body = {"tool": tool, "arguments": args or {}, **extra}
        if session:
            body["session_id"] = session
        if approval:
            body["approval"] = {"id": approval}
        return await self.request(f"toolmesh.v1.call.{account}", body, timeout)

    async def close(self):
        if self.nc and not self.nc.is_closed:
            await self.nc.close()


async def eventually(what, probe, timeout=90.0, interval=0.5):
    """Polls `probe` (async, returns a truthy value when done) until it succeeds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = await probe()
            if result:
                return result
            last = "not yet"
        except Exception as e:  # noqa: BLE001 - anything (timeouts, no responders) means "not yet"
            last = f"{type(e).__name__}: {e}"
        await asyncio.sleep(interval)
    raise CheckFailed(f"{what}: not within {timeout:.0f} s (last: {last})")


async def cluster(node):
    reply = await node.request("toolmesh.v1.status", {}, timeout=5)
    return reply.get("nodes", []) if reply.get("ok") else []


def with_role(nodes, role):
    return sorted(n["node_id"] for n in nodes if role in n["roles"])


def container_of(node_id):
    """A sandbox worker's node id starts with its container id (its hostname)."""
    return node_id.rsplit("-", 1)[0]


async def wait_cluster(node, workers, gateways=2):
    async def ready():
        nodes = await cluster(node)
        ok = (
            len(with_role(nodes, "gateway")) >= gateways
            and with_role(nodes, "approval")
            and with_role(nodes, "workspace")
            and len(with_role(nodes, "sandbox")) >= workers
        )
        return nodes if ok else None

    return await eventually(f"{gateways} gateways, approval, workspace, {workers} sandbox workers", ready, 180)


async def holder(node, session):
    reply = await node.call("bench", "sandbox_status", session=session, timeout=30)
    if not reply.get("ok"):
        raise CheckFailed(f"sandbox_status of {session} failed: {reply}")
    return reply["node_id"]


async def approved_call(client, approver, account, tool, args, session):
    """The out-of-band flow: approval_required, the approver decides, the call runs."""
    first = await client.call(account, tool, args, session=session)
    if first.get("error") != "approval_required":
        raise CheckFailed(f"expected approval_required: {first}")
    appr = first["approval_request"]["id"]
    decided = await approver.request(f"toolmesh.v1.approvals.{account}.decide", {"id": appr, "approved": True})
    if not decided.get("ok"):
        raise CheckFailed(f"decide failed: {decided}")
    return await client.call(account, tool, args, session=session, approval=appr)


# --- the checks ---------------------------------------------------------------------------


async def check_status_and_micro(c):
    nodes = await cluster(c["node"])
    log("cluster:", ", ".join(f"{n['node_id']}({'+'.join(n['roles'])})" for n in nodes))
    workers = [n for n in nodes if "sandbox" in n["roles"]]
    expect(all(n.get("sandbox") and n["sandbox"]["capacity"] > 0 for n in workers), "every worker reports its sandbox capacity")
    # $SRV discovery: every node answers PING for itself and each of its actors.
    inbox = c["node"].nc.new_inbox()
    sub = await c["node"].nc.subscribe(inbox)
    await c["node"].nc.publish("$SRV.PING", b"", reply=inbox)
    pongs = []
    try:
        while True:
            msg = await sub.next_msg(timeout=1.0)
            pongs.append(json.loads(msg.data))
    except NatsTimeout:
        pass
    await sub.unsubscribe()
    names = sorted({p["name"] for p in pongs})
    log("$SRV.PING:", len(pongs), "answers from", names)
    expect(all(p["type"] == "io.nats.micro.v1.ping_response" for p in pongs), "PING answers are io.nats.micro.v1.ping_response")
    expect(len([p for p in pongs if p["name"] == "toolmesh-node"]) == len(nodes), "one toolmesh-node instance per node")
    expect(len([p for p in pongs if p["name"] == "toolmesh-sandbox"]) == len(workers), "one toolmesh-sandbox instance per worker")
    info = await c["node"].request(f"$SRV.INFO.toolmesh-sandbox.{workers[0]['node_id']}", {}, timeout=5)
    expect(
        info["type"] == "io.nats.micro.v1.info_response"
        and {"toolmesh.internal.v1.run.sandbox"} <= {e["subject"] for e in info["endpoints"]},
        "INFO of one worker names its endpoints",
        info,
    )
    stats = await c["node"].request("$SRV.STATS.toolmesh-gateway", {}, timeout=5)
    expect(stats["type"] == "io.nats.micro.v1.stats_response" and stats["endpoints"], "STATS of a gateway", stats)


async def check_spread(c):
    """Sessions land on several workers (NATS queue group), and stay there."""
    sessions = [f"spread-{i}-{uuid.uuid4().hex[:6]}" for i in range(9)]
    replies = await asyncio.gather(
        *(c["node"].call("bench", "run_command", {"command": "echo hi"}, session=s) for s in sessions)
    )
    expect(all(r.get("ok") and r.get("stdout") == "hi\n" for r in replies), "9 sessions ran echo", replies[0])
    holders = {s: await holder(c["node"], s) for s in sessions}
    used = sorted(set(holders.values()))
    log("sessions per worker:", {w: list(holders.values()).count(w) for w in used})
    expect(len(used) >= 2, f"the sessions are spread over {len(used)} workers")
    again = await asyncio.gather(*(holder(c["node"], s) for s in sessions))
    expect(list(holders.values()) == again, "every session stays on its worker")


async def check_kill_worker(c):
    """A worker killed mid-command: its caller hears `unavailable` long before the deadline,
    and the session's next call runs on a surviving worker."""
    node = c["node"]
    session = f"kill-{uuid.uuid4().hex[:6]}"
    await node.call("bench", "run_command", {"command": "true"}, session=session)
    victim = await holder(node, session)
    call = asyncio.create_task(
        node.call("bench", "run_command", {"command": "echo start; sleep 100", "timeout": 120}, session=session, timeout=170)
    )
    await asyncio.sleep(2.0)
    expect(not call.done(), "the long command is running")
    log(f"  docker kill {container_of(victim)} (worker {victim}, running the command)")
    killed_at = time.monotonic()
    sh("docker", "kill", container_of(victim))
    reply = await call
    waited = time.monotonic() - killed_at
    log(f"  caller answered {waited:.1f} s after the kill: {reply.get('error')}: {reply.get('error_message', '')[:100]}")
    expect(reply.get("error") == "unavailable", "the caller gets unavailable", reply)
    expect(waited < 30, f"…within {waited:.1f} s of the kill (the command's deadline was 100 s away)")
    nxt = await eventually(
        "the session's next call",
        lambda: node.call("bench", "run_command", {"command": "echo again"}, session=session, timeout=60),
        60,
    )
    expect(nxt.get("ok") and nxt.get("stdout") == "again\n", "the session's next call runs", nxt)
    survivor = await holder(node, session)
    expect(survivor != victim, f"…on another worker ({survivor})")
    # The survivors reap the dead worker's egress network; its stopped container must still
    # start afterwards. Bring the fleet back to three with the command docs/operations.md gives.
    async def reaped():
        left = sh("docker", "network", "ls", "-q", "--filter", f"label=io.toolmesh.node={victim}")
        return not left.strip()

    await eventually("the dead worker's egress network reaped", reaped, 120)
    compose("up", "-d", "--scale", "sandbox=3", "sandbox")
    await wait_cluster(node, 3)
    project = os.environ.get("COMPOSE_PROJECT_NAME", "")
    labelled = sh("docker", "network", "ls", "-q", "--filter", f"label=io.toolmesh.project={project}")
    expect(len(labelled.split()) >= 3, "each worker's egress network carries the compose project", labelled)


async def check_drain_worker(c):
    """`docker stop` (SIGTERM) drains a worker: every call it was running still gets its reply."""
    node = c["node"]
    sessions = [f"drain-{i}-{uuid.uuid4().hex[:6]}" for i in range(8)]
    await asyncio.gather(*(node.call("bench", "run_command", {"command": "true"}, session=s) for s in sessions))
    holders = {s: await holder(node, s) for s in sessions}
    counts = {}
    for w in holders.values():
        counts[w] = counts.get(w, 0) + 1
    victim = max(counts, key=counts.get)
    mine = [s for s in sessions if holders[s] == victim]
    log(f"  worker {victim} holds {len(mine)} of {len(sessions)} sessions")
    calls = [
        asyncio.create_task(node.call("bench", "run_command", {"command": "sleep 4; echo done"}, session=s, timeout=120))
        for s in sessions
    ]
    await asyncio.sleep(1.5)
    log(f"  docker stop {container_of(victim)} while {len(calls)} commands run")
    stopped_at = time.monotonic()
    stop = asyncio.create_task(asyncio.to_thread(sh, "docker", "stop", "-t", "40", container_of(victim)))
    replies = await asyncio.gather(*calls)
    await stop
    log(f"  stopped in {time.monotonic() - stopped_at:.1f} s")
    bad = [r for r in replies if not (r.get("ok") and r.get("stdout") == "done\n")]
    expect(not bad, f"all {len(replies)} in-flight calls answered ok (none lost)", bad[:2])
    state = sh("docker", "inspect", "-f", "{{.State.ExitCode}}", container_of(victim))
    expect(state == "0", "the drained worker exited 0")
    again = await asyncio.gather(
        *(node.call("bench", "run_command", {"command": "echo after"}, session=s, timeout=60) for s in mine)
    )
    expect(all(r.get("ok") for r in again), "its sessions run again on the survivors", [r for r in again if not r.get("ok")][:1])
    compose("up", "-d", "--no-recreate", "--scale", "sandbox=3", "sandbox")
    await wait_cluster(node, 3)


async def check_nats_restart(c):
    """nats-server restarts: every node reconnects by itself and calls resume."""
    node = c["node"]
    session = f"natsr-{uuid.uuid4().hex[:6]}"
    log("  docker-compose restart nats")
    compose("restart", "nats")
    restarted = time.monotonic()

    async def works():
        status = await node.call("acme", "component_status", timeout=5)
        cmd = await node.call("bench", "run_command", {"command": "echo back"}, session=session, timeout=30)
        return status.get("ok") and cmd.get("ok") and cmd

    await eventually("calls after the NATS restart", works, 90)
    log(f"  calls resumed {time.monotonic() - restarted:.1f} s after the restart")
    nodes = await wait_cluster(node, 3)
    expect(len(nodes) >= 7, f"all {len(nodes)} nodes are back in the cluster view")


async def check_redis_restart(c):
    """Redis restarts with approvals pending: none is lost, and they can still be decided."""
    acme, approver = c["acme"], c["approver"]
    ids = []
    for i in range(3):
        r = await acme.call("acme", "run_command", {"command": f"echo pending {i}"}, session=f"redis-{i}")
        expect(r.get("error") == "approval_required", f"approval {i} is pending", r)
        ids.append(r["approval_request"]["id"])
    log("  docker-compose restart redis")
    compose("restart", "redis")

    async def listed():
        reply = await approver.request("toolmesh.v1.approvals.acme.list", {}, timeout=5)
        return reply.get("ok") and {a["id"] for a in reply["approvals"]}

    seen = await eventually("listing approvals after the Redis restart", listed, 60)
    expect(set(ids) <= seen, "every pending approval survived the restart")
    # Each sandbox worker's session registry notices the lost Redis connection on its first
    # call after the restart, which answers `unavailable` (and, today, uses up the approval it
    # presented: reported), then reconnects. Wait until new sessions run on every worker (20
    # in a row, spread by the queue group) before redeeming an approval.
    node = c["node"]
    failures = 0

    async def twenty_in_a_row():
        nonlocal failures
        for _ in range(20):
            r = await node.call("bench", "run_command", {"command": "true"}, session=f"probe-{uuid.uuid4().hex[:8]}", timeout=30)
            if not r.get("ok"):
                failures += 1
                return False
        return True

    await eventually("sandbox calls after the Redis restart", twenty_in_a_row, 60, interval=0.2)
    log(f"  sandbox calls answered unavailable {failures} time(s) after the Redis restart, then worked")
    r = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": ids[0], "approved": True}, timeout=10)
    expect(r.get("ok") and r["approval"]["status"] == "approved", "one of them is approved after the restart", r)
    run = await acme.call("acme", "run_command", {"command": "echo pending 0"}, session="redis-0", approval=ids[0])
    expect(run.get("ok") and run.get("stdout") == "pending 0\n", "and its call runs", run)


async def check_two_gateways(c):
    """An approval requested through one gateway is decided and redeemed through the other.
    Which gateway NATS picks cannot be chosen from outside, so the other one is stopped
    while each step runs."""
    acme, approver, node = c["acme"], c["approver"], c["node"]
    session = f"gw-{uuid.uuid4().hex[:6]}"
    args = {"command": "echo via two gateways"}
    compose("stop", "gateway-b")
    first = await acme.call("acme", "run_command", args, session=session)
    expect(first.get("error") == "approval_required", "requested through gateway-a (gateway-b stopped)", first)
    appr = first["approval_request"]["id"]
    compose("start", "gateway-b")
    await wait_cluster(node, 3, gateways=2)
    compose("stop", "gateway-a")
    r = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": appr, "approved": True})
    expect(r.get("ok"), "decided", r)
    run = await acme.call("acme", "run_command", args, session=session, approval=appr)
    expect(run.get("ok") and run.get("stdout") == "via two gateways\n", "redeemed through gateway-b (gateway-a stopped)", run)
    # Parked: a call waiting for the decision on one gateway is released by a decision made
    # while the other gateway is the only one up.
    compose("start", "gateway-a")
    await wait_cluster(node, 3, gateways=2)
    compose("stop", "gateway-b")
    parked = asyncio.create_task(
        acme.call("acme", "run_command", {"command": "echo parked"}, session=session, timeout=120, wait_for_approval_s=60)
    )

    async def pending():
        reply = await approver.request("toolmesh.v1.approvals.acme.list", {}, timeout=5)
        return [a["id"] for a in reply.get("approvals", []) if a["session_id"] == session and a["status"] == "pending"]

    (appr2,) = await eventually("the parked call's approval", pending, 30)
    compose("start", "gateway-b")
    await wait_cluster(node, 3, gateways=2)
    r = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": appr2, "approved": True})
    expect(r.get("ok"), "the parked call's approval is decided", r)
    run = await parked
    expect(run.get("ok") and run.get("stdout") == "parked\n", "the call parked on gateway-a runs", run)


async def denied(conn, action):
    """Runs `action` and expects the server to refuse it with a permissions violation."""
    before = len(conn.errors)
    try:
        await action()
    except NatsTimeout:
        pass
    await asyncio.sleep(0.3)
    new = conn.errors[before:]
    return any("permissions violation" in e.lower() for e in new), new


async def check_accounts(c):
    """globex's user cannot call, list, decide, watch anything of acme's, nor read its replies."""
    acme, approver = c["acme"], c["approver"]
    globex = await Conn("globex").open()
    try:
        own = await globex.call("globex", "component_status", timeout=10)
        expect(own.get("ok"), "globex calls its own account")
        pending = await acme.call("acme", "run_command", {"command": "echo secret"}, session="acct")
        appr = pending["approval_request"]["id"]
        attempts = {
            "call acme": lambda: globex.call("acme", "component_status", timeout=1.5),
            "list acme's approvals": lambda: globex.request("toolmesh.v1.approvals.acme.list", {}, timeout=1.5),
            "get acme's approval": lambda: globex.request("toolmesh.v1.approvals.acme.get", {"id": appr}, timeout=1.5),
            "decide acme's approval": lambda: globex.request(
                "toolmesh.v1.approvals.acme.decide", {"id": appr, "approved": True}, timeout=1.5
            ),
            "decide its own approval (only the approver decides)": lambda: globex.request(
                "toolmesh.v1.approvals.globex.decide", {"id": appr, "approved": True}, timeout=1.5
            ),
            "cancel acme's calls": lambda: globex.request("toolmesh.v1.cancel.acme", {"invocation_id": "x"}, timeout=1.5),
            "read acme's audit trail": lambda: globex.request("toolmesh.v1.audit.acme.query", {}, timeout=1.5),
            "write an entry on acme's audit chain": lambda: globex.request("toolmesh.v1.audit.acme", {}, timeout=1.5),
        }
        for what, action in attempts.items():
            refused, errors = await denied(globex, action)
            expect(refused, f"globex cannot {what} (server: permissions violation)", errors)
        got = []
        for subject in [
            "toolmesh.v1.approvals.acme.requested",
            "toolmesh.v1.approvals.acme.decided",
            "toolmesh.v1.events.acme.>",
            "_INBOX.>",
            "_INBOX.acme.>",
            ">",
        ]:
            before = len(globex.errors)

            async def keep(msg, subject=subject):
                got.append((subject, msg.subject))

            await globex.nc.subscribe(subject, cb=keep)
            await globex.nc.flush()
            await asyncio.sleep(0.3)
            expect(
                any("permissions violation" in e.lower() for e in globex.errors[before:]),
                f"globex cannot subscribe to {subject}",
                globex.errors[before:],
            )
        # acme works while globex listens everywhere it tried to.
        r = await acme.call("acme", "run_command", {"command": "echo secret"}, session="acct")
        await approver.request("toolmesh.v1.approvals.acme.decide", {"id": r["approval_request"]["id"], "approved": True})
        r = await acme.call("acme", "run_command", {"command": "echo secret"}, session="acct", approval=r["approval_request"]["id"])
        expect(r.get("ok") and r.get("stdout") == "secret\n", "meanwhile acme's call, approval and reply go through")
        await asyncio.sleep(0.5)
        expect(not got, "globex received none of acme's messages", got)
        state = await approver.request("toolmesh.v1.approvals.acme.get", {"id": appr})
        expect(state["approval"]["status"] == "pending", "acme's approval is still pending, undecided by globex")
        # The private inbox is what makes replies private: acme's user with the default
        # `_INBOX` prefix cannot even receive its own replies.
        plain = Conn("acme")
        errors = []

        async def on_error(e):
            errors.append(str(e))

        plain.nc = await nats.connect(URL, user="acme", password=PASSWORDS["acme"], error_cb=on_error)
        try:
            await plain.call("acme", "component_status", timeout=1.5)
            raise CheckFailed("a reply arrived on _INBOX for the acme user")
        except NatsTimeout:
            pass
        await asyncio.sleep(0.3)
        expect(any("permissions violation" in e.lower() for e in errors), "acme's user cannot subscribe to _INBOX.> either")
        await plain.close()
        # Through a node's reply: acme's call names a reply subject of globex's. No node
        # answers there (PROTOCOL.md "Tenancy and trust", replies go to inboxes only).
        forged = []

        async def overheard(msg):
            forged.append(msg.subject)

        await globex.nc.subscribe("toolmesh.v1.events.globex.forged", cb=overheard)
        await globex.nc.flush()
        for reply_to in ("toolmesh.v1.events.globex.forged", "toolmesh.v1.cancel.globex"):
            await acme.nc.publish(
                "toolmesh.v1.call.acme",
                json.dumps({"tool": "component_status"}).encode(),
                reply=reply_to,
            )
        barrier = await acme.call("acme", "component_status", timeout=10)
        expect(barrier.get("ok"), "acme's ordinary call after them is answered")
        await asyncio.sleep(0.5)
        expect(not forged, "no node answered acme's call on globex's events subject", forged)
    finally:
        await globex.close()


async def check_provider(c):
    """examples/provider.py as the provider user: its tool runs; it decides and hears nothing."""
    here = os.path.dirname(os.path.abspath(__file__))
    host = URL.split("://", 1)[1]
    url = f"nats://provider:{PASSWORDS['provider']}@{host}"
    name = f"tickets{uuid.uuid4().hex[:6]}"
    child = await asyncio.create_subprocess_exec(
        sys.executable, os.path.join(here, "provider.py"), "--nats", url, "--name", name,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        expect(line.decode().startswith(f"ready {name}"), "the provider connects as the provider user", line)
        acme, approver = c["acme"], c["approver"]
        provider = await Conn("provider").open()
        try:
            args = {"title": "printer on fire"}

            async def gated():
                r = await acme.call("acme", "ticket_create", args, session="prov", timeout=10)
                return r if r.get("error") != "unknown_tool" else None

            r = await eventually("the gateways know ticket_create", gated, 30)
            expect(r.get("error") == "approval_required", "ticket_create (medium) asks for approval", r)
            appr = r["approval_request"]["id"]
            refused, errors = await denied(
                provider,
                lambda: provider.nc.publish(
                    "toolmesh.v1.approvals.acme.decide", json.dumps({"id": appr, "approved": True}).encode()
                ),
            )
            expect(refused, "the provider user cannot decide an approval", errors)
            refused, errors = await denied(provider, lambda: provider.nc.subscribe("toolmesh.v1.events.>"))
            expect(refused, "the provider user cannot listen to the accounts' events", errors)
            d = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": appr, "approved": True}, timeout=10)
            expect(d.get("ok") and d["approval"]["decided_by"] != "provider", "the approver decides it", d)
            run = await acme.call("acme", "ticket_create", args, session="prov", approval=appr, timeout=30)
            expect(run.get("ok"), "the approved call runs in the provider", run)
        finally:
            await provider.close()
    finally:
        child.kill()
        await child.wait()


async def check_python_example(c):
    """examples/approve_flow.py: another process, another language."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, os.path.join(here, "approve_flow.py"), "--url", URL],
        capture_output=True,
        text=True,
        timeout=180,
    )
    for line in out.stdout.splitlines():
        log("  |", line)
    expect(out.returncode == 0, "examples/approve_flow.py exits 0", out.stderr[-800:])


async def check_disk_quota(c):
    """A sandbox's workspace is its own disk of TOOLMESH_SANDBOX_DISK_MB (compose: 4096):
    writing past it fails inside the sandbox and leaves the host's disk alone."""
    session = f"disk-{uuid.uuid4().hex[:6]}"
    r = await c["node"].call(
        "bench",
        "run_command",
        {"command": "stat -f -c '%b %S' /workspace; fallocate -l 5G /workspace/big; echo rc=$?; rm -f /workspace/big"},
        session=session,
        timeout=60,
    )
    expect(r.get("ok"), "the quota probe ran", r)
    blocks, size = (int(x) for x in r["stdout"].splitlines()[0].split())
    expect(0 < blocks * size <= 4096 * 1024 * 1024, f"/workspace is a disk of {blocks * size >> 20} MiB", r)
    expect("rc=0" not in r["stdout"] and "No space left" in r.get("stderr", ""), "5 GB does not fit", r)
    again = await c["node"].call("bench", "run_command", {"command": "echo fine"}, session=session, timeout=60)
    expect(again.get("stdout") == "fine\n", "the session works after a full disk", again)


async def check_bridge(c):
    """An MCP server through the gateway: mcp-server-time in the bridge's image."""

    async def ran():
        r = await c["acme"].call("acme", "time_get_current_time", {"timezone": "UTC"}, timeout=30)
        return r if r.get("error") != "unknown_tool" else None

    # The bridge starts the server and announces its tools; the gateways find them then.
    r = await eventually("the gateways know time_get_current_time", ran, 60)
    # Read-only (readOnlyHint): low risk, so it runs without approval in strict mode.
    expect(r.get("ok") is True and "UTC" in r.get("text", ""), "time_get_current_time runs through the gateway", r)


MCP_URL = os.environ.get("TOOLMESH_MCP_URL", "http://127.0.0.1:8931/mcp")


def mcp_post(token, method, params, msg_id=1):
    """One JSON-RPC request to the compose `mcp` service (streamable HTTP, 2025-11-25)."""
    import urllib.error
    import urllib.request

    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
        "X-Toolmesh-Session": "cluster-mcp",
    }
    if token:
        headers["Authorization"] = "Bearer " + token
    request = urllib.request.Request(MCP_URL, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as e:
        return e.code, None
    if text.startswith("{"):
        return status, json.loads(text)
    # An event stream: the last JSON-RPC message that answers this request.
    answer = None
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if message.get("id") == msg_id:
                answer = message
    return status, answer


async def check_mcp_front(c):
    """The compose `mcp` service: an MCP client's tools/list and tools/call over HTTP."""
    token = "acme-mcp-example-token"  # docker/mcp-tokens.json
    status, init = await asyncio.to_thread(
        mcp_post, token, "initialize",
        {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cluster-check", "version": "0"}})
    expect(status == 200 and init["result"]["serverInfo"]["name"] == "toolmesh", "the mcp service answers initialize", init)
    status, listed = await asyncio.to_thread(mcp_post, token, "tools/list", {}, 2)
    names = [t["name"] for t in listed["result"]["tools"]]
    expect("read_workspace_file" in names and "run_command" in names, "tools/list has the mesh's tools", names)

    async def provider_listed():
        _, again = await asyncio.to_thread(mcp_post, token, "tools/list", {}, 3)
        return again if any(t["name"] == "time_get_current_time" for t in again["result"]["tools"]) else None

    await eventually("tools/list has the bridge's time_get_current_time", provider_listed, 60)
    status, called = await asyncio.to_thread(
        mcp_post, token, "tools/call", {"name": "time_get_current_time", "arguments": {"timezone": "UTC"}}, 4)
    result = called["result"]
    expect(result.get("isError") is False and result["structuredContent"]["ok"] is True,
           "tools/call runs a provider tool through the mesh", result)
    status, _ = await asyncio.to_thread(mcp_post, "not-a-token", "tools/list", {}, 5)
    expect(status == 401, "an unknown token gets 401", status)


# Run in a py-net sandbox: PyPI through the proxy, another host refused by it, and the
# worker's container reached at another port than the proxy's (dropped: a timeout, where a
# port without a listener would refuse at once). Prints one JSON line.
EGRESS_PROBE = r"""
import json, os, socket, ssl, urllib.parse, urllib.request
ctx = ssl.create_default_context(cafile=os.environ.get("CA_FILE") or None)
out = {}
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=30, context=ctx) as r:
            return r.status
    except Exception as e:
        return str(e)[:200]
out["pypi"] = get("https://pypi.org/simple/six/")
out["other"] = get("https://example.com/")
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
s = socket.socket()
s.settimeout(3)
try:
    s.connect((proxy.hostname, 4222))
    out["worker_port"] = "connected"
except socket.timeout:
    out["worker_port"] = "timeout"
except OSError as e:
    out["worker_port"] = e.strerror
print(json.dumps(out))
"""


async def check_egress(c):
    """A py-net sandbox (docker/sandbox-templates.toml) on a worker in a container: PyPI through
    the worker's egress proxy, other hosts refused (403), the worker's other ports dropped."""
    extra_ca = "".join(
        open(os.path.join(d, f)).read()
        for d in ["/usr/local/share/ca-certificates"] if os.path.isdir(d)
        for f in sorted(os.listdir(d)) if f.endswith(".crt"))
    command = (
        "{ cat /etc/ssl/certs/ca-certificates.crt; printf '%s\\n' \"$EXTRA_CA\"; } > /workspace/ca.crt"
        " && CA_FILE=/workspace/ca.crt python3 -c \"$PROBE\"")
    session = f"egress-{uuid.uuid4().hex[:6]}"
    r = await c["node"].call(
        "bench", "run_command",
        {"command": command, "template": "py-net", "timeout": 120,
         "env": {"EXTRA_CA": extra_ca, "PROBE": EGRESS_PROBE}},
        session=session, timeout=180)
    expect(r.get("ok") is True and r.get("exit_code") == 0, "the py-net probe ran", r)
    got = json.loads(r["stdout"].strip().splitlines()[-1])
    expect(got["pypi"] == 200, "PyPI answers through the proxy", got)
    expect("403" in str(got["other"]), "another host gets the proxy's 403", got)
    expect(got["worker_port"] == "timeout", "the worker's other ports are dropped", got)
    status = await c["node"].call("bench", "sandbox_status", {}, session=session, timeout=60)
    expect(status.get("template_id") == "py-net" and status.get("network") == "allow",
           "sandbox_status names the template and its network", status)


def audit_sha256(entry):
    """The hash rule of docs/PROTOCOL.md: sha256 of the JCS form of the entry without
    `sha256` (JCS = sorted keys, no spaces, UTF-8, for the strings, integers, booleans and
    nulls an entry holds)."""
    import hashlib

    body = {k: v for k, v in entry.items() if k not in ("sha256", "seq")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


async def audit_entries(conn, account):
    """Every entry of `account`'s audit trail, read as `conn` page by page."""
    entries, since = [], None
    while True:
        body = {"limit": 1000, **({"since": since} if since else {})}
        page = await conn.request(f"toolmesh.v1.audit.{account}.query", body, timeout=30)
        if page.get("ok") is not True:
            raise CheckFailed(f"the audit query failed: {page}")
        entries += page["entries"]
        if not page.get("more"):
            return entries
        since = page["entries"][-1]["seq"]


def verify_chain(entries):
    """Each entry's sha256 is the hash of its body, and links to the one before it."""
    prev = None
    for e in entries:
        if e["sha256"] != audit_sha256(e):
            raise CheckFailed(f"entry {e['seq']}: its sha256 is not the hash of its body: {e}")
        if prev is not None and e["prev_sha256"] != prev:
            raise CheckFailed(f"entry {e['seq']}: prev_sha256 is not the entry before it")
        prev = e["sha256"]


async def check_audit(c):
    """acme reads its own audit trail (its broker permissions allow the query) and checks
    every hash and link with an implementation of its own; the call it just made is on it."""
    acme = c["acme"]
    # Calls (entries `finished`) and a gated one (an approval `requested`), so links are checked.
    replies = [await acme.call("acme", "component_status", timeout=30) for _ in range(4)]
    expect(all(r.get("ok") is True for r in replies), "acme makes four calls", replies[-1])
    gated = await acme.call("acme", "run_command", {"command": "echo audit"}, session="audit-check")
    expect(gated.get("error") == "approval_required", "and one that waits for approval", gated)
    invocation = replies[-1]["invocation_id"]
    entries = await audit_entries(acme, "acme")
    expect(any(e["invocation_id"] == invocation and e["kind"] == "call" and e["status"] == "finished" for e in entries),
           f"the call is on the trail ({len(entries)} entries)", entries[-3:])
    expect(any(e["kind"] == "approval" and e["status"] == "requested" and e["invocation_id"] == gated["invocation_id"]
               for e in entries) and len(entries) >= 6, "so is the requested approval", entries[-3:])
    verify_chain(entries)
    expect(True, "every hash and link checks out in Python")


CONSOLE_URL = os.environ.get("TOOLMESH_CONSOLE_URL", "http://127.0.0.1:8932")


def console_get(path, token):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(CONSOLE_URL + path, headers={"Authorization": "Bearer " + token})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, None


async def check_console(c):
    """The compose `console` service: a console token signs in, sees its own account's
    pending approvals, and not another account's."""
    token = "acme-console-example-token"  # docker/console-tokens.json
    pending = await c["acme"].call("acme", "run_command", {"command": "echo console"}, session="console-check")
    appr = pending["approval_request"]["id"]
    status, me = await asyncio.to_thread(console_get, "/api/me", token)
    expect(status == 200 and me["approver"] == "acme-approver", "the console knows the token's approver", me)
    status, listed = await asyncio.to_thread(console_get, "/api/approvals/acme", token)
    ids = [a["approval"]["id"] for a in (listed or {}).get("approvals", [])]
    expect(status == 200 and appr in ids, "the console lists acme's pending approval", listed)
    status, _ = await asyncio.to_thread(console_get, "/api/approvals/globex", token)
    expect(status == 403, "an acme token cannot list globex's approvals", status)
    status, _ = await asyncio.to_thread(console_get, "/api/me", "not-a-token")
    expect(status == 401, "an unknown console token gets 401", status)


PROMETHEUS_URL = os.environ.get("TOOLMESH_PROMETHEUS_URL", "http://127.0.0.1:9090")
NODE_SERVICES = {"gateway-a", "gateway-b", "approval", "workspace", "skills", "web", "bridge", "mcp", "console"}


async def check_prometheus(c):
    """The compose `prometheus` service, on the host: it scrapes every node, each scaled
    sandbox worker included, and holds toolmesh's metrics."""
    import urllib.parse
    import urllib.request

    def get(path):
        with urllib.request.urlopen(PROMETHEUS_URL + path, timeout=10) as response:
            return json.loads(response.read())

    workers = len(with_role(await cluster(c["node"]), "sandbox"))

    async def all_up():
        targets = (await asyncio.to_thread(get, "/api/v1/targets?state=active"))["data"]["activeTargets"]
        up = [t["labels"].get("service") for t in targets if t["health"] == "up"]
        return up if NODE_SERVICES <= set(up) and up.count("sandbox") >= workers else None

    up = await eventually("every node scraped and up", all_up)
    expect(True, f"Prometheus scrapes {len(up)} nodes, {up.count('sandbox')} sandbox workers among them")
    query = urllib.parse.quote('count(up{job="toolmesh"} == 1)')
    counted = await asyncio.to_thread(get, f"/api/v1/query?query={query}")
    expect(counted["status"] == "success", "Prometheus answers a query", counted)


CHECKS = {
    "status": check_status_and_micro,
    "bridge": check_bridge,
    "mcp": check_mcp_front,
    "egress": check_egress,
    "audit": check_audit,
    "console": check_console,
    "prometheus": check_prometheus,
    "spread": check_spread,
    "disk": check_disk_quota,
    "accounts": check_accounts,
    "provider": check_provider,
    "python": check_python_example,
    "gateways": check_two_gateways,
    "redis": check_redis_restart,
    "kill": check_kill_worker,
    "drain": check_drain_worker,
    "nats": check_nats_restart,
}


async def run_checks(only):
    conns = {"node": await Conn("toolmesh").open(), "acme": await Conn("acme").open(), "approver": await Conn("approver").open()}
    results = []
    try:
        await wait_cluster(conns["node"], 3)
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            log(f"== {name}: {check.__doc__.splitlines()[0] if check.__doc__ else ''}")
            started = time.monotonic()
            try:
                await check(conns)
                results.append((name, "passed", time.monotonic() - started))
            except Exception as e:  # noqa: BLE001 - report and stop
                results.append((name, f"FAILED: {type(e).__name__}: {e}", time.monotonic() - started))
                break
    finally:
        for conn in conns.values():
            await conn.close()
    print("\ncluster check summary:")
    for name, outcome, took in results:
        print(f"  {name:10} {took:6.1f} s  {outcome}")
    failed = [r for r in results if r[1] != "passed"]
    skipped = [n for n in CHECKS if (not only or n in only) and n not in {r[0] for r in results}]
    if skipped:
        print("  not run:", ", ".join(skipped))
    return 1 if failed or skipped else 0


async def run_bench(concurrency, seconds, workers):
    """run_command `true` in warm sessions: `concurrency` callers, each its own session, for
    `seconds`; throughput and latency percentiles."""
    node = await Conn("toolmesh").open()
    try:
        await wait_cluster(node, workers)
        sessions = [f"bench-{i}-{uuid.uuid4().hex[:6]}" for i in range(concurrency)]
        warm = await asyncio.gather(*(node.call("bench", "run_command", {"command": "true"}, session=s) for s in sessions))
        if not all(r.get("ok") for r in warm):
            raise CheckFailed(f"warm-up failed: {warm}")
        holders = [await holder(node, s) for s in sessions]
        latencies, errors = [], 0
        deadline = time.monotonic() + seconds

        async def caller(session):
            nonlocal errors
            while time.monotonic() < deadline:
                t = time.perf_counter()
                r = await node.call("bench", "run_command", {"command": "true"}, session=session, timeout=60)
                if r.get("ok"):
                    latencies.append((time.perf_counter() - t) * 1000)
                else:
                    errors += 1

        started = time.monotonic()
        await asyncio.gather(*(caller(s) for s in sessions))
        took = time.monotonic() - started
        latencies.sort()
        q = statistics.quantiles(latencies, n=100)
        print(
            json.dumps(
                {
                    "workers": workers,
                    "sessions_per_worker": {w: holders.count(w) for w in sorted(set(holders))},
                    "concurrency": concurrency,
                    "seconds": round(took, 1),
                    "calls": len(latencies),
                    "errors": errors,
                    "calls_per_s": round(len(latencies) / took, 1),
                    "p50_ms": round(q[49], 1),
                    "p99_ms": round(q[98], 1),
                }
            )
        )
        return 0 if errors == 0 else 1
    finally:
        await node.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    check = sub.add_parser("check")
    check.add_argument("--only", default="", help="comma-separated: " + ",".join(CHECKS))
    bench = sub.add_parser("bench")
    bench.add_argument("--concurrency", type=int, default=8)
    bench.add_argument("--seconds", type=float, default=20)
    bench.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    if args.mode == "check":
        only = {n for n in args.only.split(",") if n}
        return asyncio.run(run_checks(only))
    return asyncio.run(run_bench(args.concurrency, args.seconds, args.workers))


if __name__ == "__main__":
    sys.exit(main())
