#!/usr/bin/env python3
"""A toolmesh client in Python (nats-py), as a client of the compose cluster.

It runs a high-risk tool as the account user `acme`, gets `approval_required`, approves the
request from a second connection (the `approver` user, as a person's UI would), and runs the
tool again with the approval's id. Only the public protocol (PROTOCOL.md) is used.

    pip install nats-py
    python3 examples/approve_flow.py [--url nats://127.0.0.1:4222]

Each account user may subscribe only to its own inbox prefix (docker/nats.conf), so the
connection names it: `inbox_prefix="_INBOX.acme"`. Exits 0 when the flow worked, 1 otherwise.
"""

import argparse
import asyncio
import json
import os
import sys
import uuid

import nats


async def request(nc, subject, body, timeout=60.0):
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=timeout)
    return json.loads(msg.data)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("TOOLMESH_CLIENT_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--account", default="acme")
    parser.add_argument("--password", default=os.environ.get("TOOLMESH_NATS_ACME_PASSWORD", "acme-secret"))
    parser.add_argument(
        "--approver-password", default=os.environ.get("TOOLMESH_NATS_APPROVER_PASSWORD", "approver-secret")
    )
    args = parser.parse_args()
    account = args.account

    # The agent's connection: account user, private inbox prefix.
    agent = await nats.connect(
        args.url, user=account, password=args.password, inbox_prefix=f"_INBOX.{account}", name="example-agent"
    )
    # A person's connection (a UI, a chat bot): the approver user.
    person = await nats.connect(
        args.url, user="approver", password=args.approver_password, inbox_prefix="_INBOX.approver", name="example-ui"
    )

    session = f"py-{uuid.uuid4().hex[:8]}"
    call = {
        "tool": "run_command",
        "arguments": {"command": "python3 -c 'import sys; print(\"hello from\", sys.version.split()[0])'"},
        "session_id": session,
    }

    # 1. The call needs an approval: nothing runs yet.
    reply = await request(agent, f"toolmesh.v1.call.{account}", call)
    print("first call:", reply.get("error"), "-", reply.get("error_message", "")[:80])
    if reply.get("error") != "approval_required":
        print("expected approval_required, got:", json.dumps(reply, indent=2), file=sys.stderr)
        return 1
    approval_id = reply["approval_request"]["id"]

    # 2. The person sees it and approves it, from another connection.
    pending = await request(person, f"toolmesh.v1.approvals.{account}.list", {})
    ids = [a["id"] for a in pending.get("approvals", [])]
    print("pending approvals seen by the approver:", len(ids), "including ours:", approval_id in ids)
    decided = await request(
        person,
        f"toolmesh.v1.approvals.{account}.decide",
        {"id": approval_id, "approved": True, "approver": "example-ui", "reason": "harmless"},
    )
    print("decision:", decided.get("approval", {}).get("status"), "by", decided.get("approval", {}).get("decided_by"))
    if not decided.get("ok"):
        print("the decision failed:", decided, file=sys.stderr)
        return 1

    # 3. The agent repeats the call with the approval's id: it runs.
    call["approval"] = {"id": approval_id}
    reply = await request(agent, f"toolmesh.v1.call.{account}", call, timeout=120)
    print("second call: ok =", reply.get("ok"), "stdout =", repr(reply.get("stdout")))
    ok = reply.get("ok") is True and "hello from" in reply.get("stdout", "")

    # 4. The approval was for one call only.
    reply = await request(agent, f"toolmesh.v1.call.{account}", call)
    print("third call with the same approval:", reply.get("error"))
    ok = ok and reply.get("error") == "approval_expired"

    await agent.drain()
    await person.drain()
    print("approve flow:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
