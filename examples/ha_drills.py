#!/usr/bin/env python3
"""Failure drills on the HA compose cluster (compose.yml + compose.ha.yml), under load.

    python3 examples/ha_drills.py [--only nats,redis,leaf,restarts] [--load-seconds 20]
    python3 examples/ha_drills.py --steady 30     # the load alone, on either cluster

Run by `scripts/cluster-test --ha`. A steady load runs through every drill: each of two
accounts (acme, globex) loops over a read, a write behind an approval and a sandbox command
behind an approval, the approver deciding as soon as an approval is requested. The drills:

- nats: kill the NATS server the load's clients are connected to, bring it back;
- redis: park 20 calls for approval, decide half, then kill the Redis primary while the other
  half are being decided;
- leaf: cut the worker site's leaf link (its server leaves the cluster's network), restore it;
- restarts: restart every toolmesh container one at a time.

Each drill prints calls made, answered ok, answered with each error code, unanswered, lost
decisions and its recovery time, and fails (exit 1) when a call goes unanswered, a decision
acknowledged before a fault is lost, or (restarts) a call fails with anything but an
`unavailable` that a retry turns into a success. Helpers (connections, docker) come from
examples/cluster_check.py.
"""

import argparse
import asyncio
import collections
import json
import os
import sys
import time
import urllib.parse
import uuid

from cluster_check import (
    T0,
    URL,
    CheckFailed,
    Conn,
    audit_entries,
    cluster,
    compose,
    eventually,
    expect,
    log,
    sh,
    verify_chain,
)

ACCOUNTS = ("acme", "globex")
# Attempts of a step that answered `unavailable` during the restarts drill.
RETRIES = 8


class Tally:
    """What one drill's load saw."""

    def __init__(self):
        self.made = 0
        self.codes = collections.Counter()
        self.unanswered = 0
        self.failed_after_retry = []
        self.finished_ok = []  # (account, invocation_id, answered at) of calls answered ok

    def answered(self, account, reply):
        self.made += 1
        if reply.get("error") == "approval_required":
            # The first step of a gated call, not a failure: the load decides and calls again.
            self.codes["asked_approval"] += 1
        elif reply.get("ok"):
            self.codes["ok"] += 1
            self.finished_ok.append((account, reply["invocation_id"], time.monotonic()))
        else:
            self.codes[reply.get("error", "?")] += 1

    def summary(self):
        return {
            "calls": self.made,
            "ok": self.codes["ok"],
            "asked_approval": self.codes["asked_approval"],
            "errors": {k: v for k, v in sorted(self.codes.items()) if k not in ("ok", "asked_approval")},
            "unanswered": self.unanswered,
            "failed_after_retry": len(self.failed_after_retry),
        }


class Load:
    """Two accounts' callers, each with its own session, looping until stopped."""

    def __init__(self, conns, per_account=2, retry_unavailable=False):
        self.conns = conns
        self.per_account = per_account
        self.retry = retry_unavailable
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.tasks = []

    async def call(self, account, tool, args, session, approval=None):
        client = self.conns[account]
        try:
            reply = await client.call(account, tool, args, session=session, approval=approval, timeout=150)
        except Exception as e:  # noqa: BLE001 - no reply in time, or a request the client could not send
            self.tally.made += 1
            self.tally.unanswered += 1
            log(f"  {account}: {type(e).__name__}: {e}")
            return None
        self.tally.answered(account, reply)
        return reply

    async def step(self, account, tool, args, session):
        """One step, approved when it asks for it; retried on `unavailable` if asked to."""
        for _ in range(RETRIES if self.retry else 1):
            reply = await self.call(account, tool, args, session)
            if reply and reply.get("error") == "approval_required":
                appr = reply["approval_request"]["id"]
                try:
                    await self.conns["approver"].request(
                        f"toolmesh.v1.approvals.{account}.decide", {"id": appr, "approved": True}, timeout=30
                    )
                except Exception:  # noqa: BLE001 - the call below then answers approval_pending
                    pass
                reply = await self.call(account, tool, args, session, approval=appr)
            if reply is None or reply.get("ok") or reply.get("error") != "unavailable":
                return reply
            if not self.retry:
                return reply
            await asyncio.sleep(1)
        self.tally.failed_after_retry.append((account, tool, reply))
        return reply

    async def caller(self, account, n):
        session = f"ha-{account}-{n}-{uuid.uuid4().hex[:6]}"
        i = 0
        while not self.stop.is_set():
            i += 1
            path = f"ha/{n}.txt"
            await self.step(account, "write_workspace_file", {"path": path, "content": f"{i}\n"}, session)
            await self.step(account, "read_workspace_file", {"path": path}, session)
            await self.step(account, "run_command", {"command": f"echo {i}"}, session)

    def start(self):
        self.tasks = [
            asyncio.create_task(self.caller(a, n)) for a in ACCOUNTS for n in range(self.per_account)
        ]
        return self

    async def finish(self):
        self.stop.set()
        await asyncio.gather(*self.tasks)
        return self.tally


def servers():
    """nats://<ip>:4222 of nats-1..3 on the compose network (this host reaches it); on the
    single-server cluster, its published port."""
    if not compose("ps", "-q", "nats-1", check=False):
        return [URL]
    urls = []
    for service in ("nats-1", "nats-2", "nats-3"):
        ip = sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                container(service)).split()[0]
        urls.append(f"nats://{ip}:4222")
    return urls


def container(service):
    """The (first) container of `service`."""
    ids = compose("ps", "-q", service).split()
    if not ids:
        raise CheckFailed(f"no container of {service}")
    return sorted(ids)[0]


async def healthy(cid, what):
    async def probe():
        state = sh("docker", "inspect", "-f", "{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}",
                   cid, check=False)
        running = sh("docker", "inspect", "-f", "{{.State.Running}}", cid, check=False) == "true"
        return running and state in ("healthy", "none")

    await eventually(f"{what} running and healthy", probe, 180, 0.5)


def report(name, tally, lost, recovery):
    row = {"drill": name, **tally.summary(), "lost_decisions": lost, "recovery_s": recovery}
    print("DRILL " + json.dumps(row), flush=True)
    expect(tally.unanswered == 0, f"{name}: every call answered", row)
    expect(lost == 0, f"{name}: no decision lost", row)
    return row


async def verify_audit(conns, account):
    entries = await audit_entries(conns[account], account)
    verify_chain(entries)
    expect(True, f"{account}'s audit chain verifies whole ({len(entries)} entries)")


async def replay(js, subject):
    """Every RunEvent kept on `subject`, in stream order."""
    sub = await js.subscribe(subject, ordered_consumer=True)
    events, done = [], None
    try:
        # Until every number up to `finished`'s is in, or a second brings nothing more.
        while done is None or len(events) <= done:
            events.append(json.loads((await sub.next_msg(timeout=1)).data))
            if events[-1].get("kind") == "finished":
                done = events[-1]["seq"]
    except Exception:  # noqa: BLE001 - no more within a second
        pass
    await sub.unsubscribe()
    return events


async def verify_events(node, finished, around=None):
    """Every call answered ok has its `finished` RunEvent in TOOLMESH_EVENTS; for the calls
    answered within 10 s of `around` (a fault), every event, `seq` 0 to `finished`'s. Events
    of one call come from several nodes, so a worker's last `stdout` may be kept after the
    gateway's `finished`: their `seq` orders them, not the stream."""
    js = node.nc.jetstream()
    missing, gaps, checked = [], [], 0
    for account, invocation, at in finished:
        subject = f"toolmesh.v1.events.{account}.{invocation}"
        try:
            last = json.loads((await js.get_last_msg("TOOLMESH_EVENTS", subject)).data)
        except Exception:  # noqa: BLE001 - not found
            last = None
        near = around is not None and abs(at - around) <= 10
        if last is not None and last.get("kind") == "finished" and not near:
            continue
        events = await replay(js, subject)
        done = [e for e in events if e.get("kind") == "finished"]
        if not done:
            missing.append((invocation, at))
            continue
        if near:
            checked += 1
            seqs = sorted(e["seq"] for e in events)
            if seqs != list(range(done[0]["seq"] + 1)):
                gaps.append((invocation, seqs))
    if missing:
        log(f"  {len(missing)} of {len(finished)} without their finished event, answered between "
            f"{min(a for _, a in missing) - T0:.1f} s and {max(a for _, a in missing) - T0:.1f} s")
    expect(not missing, f"the replay has the finished event of each of {len(finished)} ok calls",
           [i for i, _ in missing[:5]])
    expect(not gaps, f"and every event of the {checked} answered within 10 s of the fault", gaps[:3])


async def events_leader(node):
    info = await node.nc.jetstream().stream_info("TOOLMESH_EVENTS")
    return info.cluster.leader if info.cluster else None


async def drill_nats(conns, seconds):
    """Kill the NATS server acme's caller is on; every call is answered."""
    load = Load(conns).start()
    await asyncio.sleep(seconds / 2)
    host = conns["acme"].nc.connected_url.hostname
    urls = dict(zip(("nats-1", "nats-2", "nats-3"), servers()))
    victim = next(name for name, url in urls.items() if urllib.parse.urlparse(url).hostname == host)
    log(f"  docker kill {victim} (acme's caller is connected to it; the events' leader is "
        f"{await events_leader(conns['node'])})")
    killed = time.monotonic()
    sh("docker", "kill", container(victim))

    async def answered_again():
        reply = await conns["acme"].call("acme", "component_status", timeout=5)
        return reply.get("ok")

    await eventually("acme is answered again", answered_again, 60, 0.2)
    recovery = round(time.monotonic() - killed, 1)
    await asyncio.sleep(seconds / 2)
    compose("start", victim)
    tally = await load.finish()
    gaps = [round(g, 1) for c in conns.values() for g in c.gaps]
    log(f"  the callers' reconnections took {gaps} s")
    expect(gaps and max(gaps) < 5, "callers reconnected within 5 s", gaps)
    for account in ACCOUNTS:
        await verify_audit(conns, account)
    await verify_events(conns["node"], tally.finished_ok, around=killed)
    return report("nats", tally, 0, recovery)


async def drill_redis(conns, seconds):
    """Kill the Redis primary with 20 parked calls and decisions racing."""
    # All three members up (an earlier run may have left one down): after the kill, a new
    # primary and one replica remain, so acknowledged writes still reach a replica (WAIT).
    compose("start", "redis", "redis-replica", "redis-replica-2")

    def primary_now():
        return sh("docker", "exec", container("sentinel-1"), "redis-cli", "-p", "26379",
                  "sentinel", "get-master-addr-by-name", "toolmesh").split()[0]

    async def two_replicas():
        info = sh("docker", "exec", container(primary_now()), "redis-cli", "info", "replication", check=False)
        return "connected_slaves:2" in info

    await eventually("the Redis primary has its two replicas", two_replicas, 120, 1)
    load = Load(conns).start()
    client, approver = conns["acme"], conns["approver"]
    invocations = [f"inv_{uuid.uuid4().hex}" for _ in range(20)]
    parked = [
        asyncio.create_task(
            client.request(
                "toolmesh.v1.call.acme",
                {
                    "tool": "write_workspace_file",
                    "invocation_id": inv,
                    "session_id": "ha-parked",
                    "arguments": {"path": f"parked/{i}.txt", "content": "x"},
                    "wait_for_approval_s": 120,
                },
                timeout=150,
            )
        )
        for i, inv in enumerate(invocations)
    ]

    async def all_pending():
        listed = await client.request("toolmesh.v1.approvals.acme.list", {}, timeout=10)
        by_inv = {a["invocation_id"]: a["id"] for a in listed.get("approvals", [])}
        return [by_inv[i] for i in invocations] if all(i in by_inv for i in invocations) else None

    ids = await eventually("20 parked calls wait for approval", all_pending, 60, 0.5)
    acked = []
    for appr in ids[:10]:
        r = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": appr, "approved": True}, timeout=30)
        if r.get("ok"):
            acked.append(appr)
    expect(len(acked) == 10, "ten decisions acknowledged before the kill")
    primary = primary_now()
    # The members announce themselves by service name (compose.ha.yml); an address, otherwise.
    members = ("redis", "redis-replica", "redis-replica-2")
    victim = primary if primary in members else next(
        m for m in members
        if primary in sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                         container(m)).split())

    async def decide(appr):
        try:
            r = await approver.request("toolmesh.v1.approvals.acme.decide", {"id": appr, "approved": True}, timeout=30)
            return appr, r
        except Exception as e:  # noqa: BLE001
            return appr, {"ok": False, "error": type(e).__name__}

    racing = [asyncio.create_task(decide(a)) for a in ids[10:]]
    log(f"  docker kill {victim} (the primary, {primary}) while 10 decisions race")
    killed = time.monotonic()
    sh("docker", "kill", container(victim))
    raced = await asyncio.gather(*racing)
    acked += [a for a, r in raced if r.get("ok")]
    log(f"  {sum(1 for _, r in raced if r.get('ok'))} of the racing decisions were acknowledged")
    # Those not acknowledged are decided again once a new primary serves (`conflict`: the
    # first attempt was applied after all, its reply lost).
    for appr, r in raced:
        if r.get("ok"):
            continue

        async def decided(appr=appr):
            _, again = await decide(appr)
            return again.get("ok") or again.get("error") == "conflict"

        await eventually(f"{appr} can still be decided", decided, 90, 1)
        acked.append(appr)
    recovery = round(time.monotonic() - killed, 1)
    log(f"  every decision made {recovery} s after the kill")
    lost = 0
    for appr in acked:
        got = await client.request("toolmesh.v1.approvals.acme.get", {"id": appr}, timeout=30)
        if got.get("approval", {}).get("status") not in ("approved", "used"):
            lost += 1
            log(f"  LOST {appr}: {got}")
    results = await asyncio.gather(*parked)
    expect(all(r.get("ok") for r in results), "every parked call completed",
           [r for r in results if not r.get("ok")][:3])
    compose("start", victim)
    await asyncio.sleep(seconds / 2)
    tally = await load.finish()
    return report("redis", tally, lost, recovery)


async def drill_leaf(conns, seconds):
    """Cut the worker site's leaf link, then restore it."""
    node = conns["node"]
    load = Load(conns).start()
    network = f"{compose_project()}_default"
    leaf = container("leaf")

    # A sandbox worker's node id starts with its hostname, its container's short id.
    site = container("sandbox-remote")[:12]

    async def site_live(live):
        nodes = await cluster(node)
        there = any(n["node_id"].startswith(site) for n in nodes)
        return there == live

    await eventually("the site's worker is in the cluster", lambda: site_live(True), 60)
    log(f"  docker network disconnect {network} leaf")
    sh("docker", "network", "disconnect", network, leaf)
    cut = time.monotonic()
    await eventually("the site's worker drops out of the cluster view", lambda: site_live(False), 30)
    left = round(time.monotonic() - cut, 1)
    await asyncio.sleep(seconds / 2)
    sh("docker", "network", "connect", network, leaf)
    restored = time.monotonic()
    await eventually("the site's worker is back", lambda: site_live(True), 60)
    recovery = round(time.monotonic() - restored, 1)
    log(f"  the site's worker left the view {left} s after the cut, was back {recovery} s after the restore")
    tally = await load.finish()
    # A session the site's worker held answers `unavailable` while the link is down.
    expect(set(tally.summary()["errors"]) <= {"unavailable"}, "no call failed but as unavailable", tally.summary())
    return report("leaf", tally, 0, recovery)


def compose_project():
    return os.environ["COMPOSE_PROJECT_NAME"]


async def drill_restarts(conns, seconds):
    """Restart every toolmesh container one at a time under load."""
    load = Load(conns, retry_unavailable=True).start()
    services = ["gateway-a", "gateway-b", "approval", "workspace", "skills", "web", "mcp", "console",
                "bridge", "sandbox", "sandbox-remote"]
    slowest = 0.0
    for service in services:
        for cid in compose("ps", "-q", service).split():
            log(f"  docker restart {service} ({cid[:12]})")
            began = time.monotonic()
            sh("docker", "restart", "-t", "40", cid)
            await healthy(cid, service)
            slowest = max(slowest, time.monotonic() - began)
    await asyncio.sleep(seconds / 2)
    tally = await load.finish()
    expect(not tally.failed_after_retry, "no call failed but with an unavailable a retry fixed",
           tally.failed_after_retry[:3])
    return report("restarts", tally, 0, round(slowest, 1))


async def steady(conns, seconds):
    """The load alone: its throughput, for comparing clusters."""
    load = Load(conns).start()
    began = time.monotonic()
    await asyncio.sleep(seconds)
    tally = await load.finish()
    took = time.monotonic() - began
    row = {"steady_s": round(took, 1), **tally.summary(), "calls_per_s": round(tally.made / took, 1),
           "ok_per_s": round(tally.codes["ok"] / took, 1)}
    print("STEADY " + json.dumps(row), flush=True)
    expect(tally.unanswered == 0 and not row["errors"], "every call of the steady load ok", row)
    return row


DRILLS = {"nats": drill_nats, "redis": drill_redis, "leaf": drill_leaf, "restarts": drill_restarts}


async def run(only, seconds, steady_s):
    urls = servers()
    conns = {user_: await Conn(user, urls).open()
             for user_, user in (("node", "toolmesh"), ("acme", "acme"), ("globex", "globex"),
                                 ("approver", "approver"))}
    rows, failed = [], None
    try:
        await eventually("the cluster answers", lambda: cluster(conns["node"]), 120)
        if steady_s:
            rows.append(await steady(conns, steady_s))
            only = {"none"}
        for name, drill in DRILLS.items():
            if only and name not in only:
                continue
            log(f"== {name}: {drill.__doc__}")
            try:
                rows.append(await drill(conns, seconds))
            except Exception as e:  # noqa: BLE001 - report and stop
                failed = f"{name}: {type(e).__name__}: {e}"
                break
    finally:
        for conn in conns.values():
            await conn.close()
    print("\nha drills summary:")
    for row in rows:
        print("  " + json.dumps(row))
    if failed:
        print("  FAILED", failed)
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(DRILLS))
    parser.add_argument("--load-seconds", type=float, default=20)
    parser.add_argument("--steady", type=float, default=0, help="only the load, this many seconds")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    return asyncio.run(run(only, args.load_seconds, args.steady))


if __name__ == "__main__":
    sys.exit(main())
