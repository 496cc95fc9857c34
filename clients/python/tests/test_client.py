"""The client against a real node: calls, approvals, RunEvents and cancel."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

import toolmesh
from conftest import NodeInfo, new_session
from support import wait_until_async
from toolmesh.client import call_timeout

WITHIN = 10.0


def workspace(node: NodeInfo, client: toolmesh.Client):
    return node.data_dir / "accounts" / node.account / "sessions" / client.session / "workspace"


async def test_a_call_returns_the_tool_reply_as_a_dict(client: toolmesh.Client) -> None:
    reply = await client.call("workspace_status")
    assert isinstance(reply, dict)
    assert reply["ok"] is True, reply
    assert reply["invocation_id"].startswith("inv")


async def test_failures_are_replies_not_exceptions(client: toolmesh.Client) -> None:
    unknown = await client.call("no_such_tool", {})
    assert unknown["ok"] is False
    assert unknown["error"] == "unknown_tool", unknown

    invalid = await client.call("read_workspace_file", {})
    assert invalid["error"] == "invalid_arguments", invalid
    assert any(d["path"] == "/path" and d["message"] for d in invalid["details"]), invalid


async def test_the_invocation_id_given_is_the_calls(client: toolmesh.Client) -> None:
    inv = client.new_invocation_id()
    reply = await client.call("workspace_status", invocation_id=inv)
    assert reply["invocation_id"] == inv


async def test_bad_input_is_refused_before_sending(client: toolmesh.Client) -> None:
    with pytest.raises(ValueError, match="invocation_id"):
        await client.call("workspace_status", invocation_id="not/valid")
    with pytest.raises(ValueError, match="wait_for_approval_s"):
        await client.call("workspace_status", wait_for_approval_s=3601)
    with pytest.raises(ValueError, match="timeout"):
        await client.call("workspace_status", wait_for_approval_s=30, timeout=30)
    with pytest.raises(ValueError, match="invocation_id"):
        await client.cancel("")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"account": "not an account"}, "account"),
        ({"account": "a" * 65}, "account"),
        ({"account": "acme", "session": "s/1"}, "session"),
    ],
)
async def test_connect_checks_account_and_session_syntax(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        await toolmesh.connect("nats://127.0.0.1:1", **kwargs)


async def test_connect_checks_the_url() -> None:
    with pytest.raises(ValueError, match="url"):
        await toolmesh.connect("nats://127.0.0.1:1,,", account="acme")


def test_the_default_timeout_outlasts_the_gateway_and_the_approval_wait() -> None:
    assert call_timeout({}, 0) == 130
    assert call_timeout({}, 600) == 730
    assert call_timeout({"timeout": 300}, 20) == 360


async def test_connect_works_as_a_context_manager(node: NodeInfo) -> None:
    async with toolmesh.connect(node.nats_url, account=node.account) as c:
        assert (await c.call("workspace_status"))["error"] == "invalid_request"  # no session
    assert c.nats.is_closed
    async with await toolmesh.connect(node.nats_url, account=node.account) as c:
        assert (await c.call("tool_search", {"query": "file"}))["ok"] is True
    assert c.nats.is_closed


async def write(client: toolmesh.Client, path: str, **kwargs) -> dict:
    return await client.call("write_workspace_file", {"path": path, "content": "hello\n"},
                             **kwargs)


async def test_an_approved_call_runs_when_repeated_with_the_approval(
    node: NodeInfo, client: toolmesh.Client
) -> None:
    gated = await write(client, "a.md")
    assert gated["error"] == "approval_required", gated
    approval = gated["approval_request"]
    assert approval["status"] == "pending"
    assert approval["tool_name"] == "write_workspace_file"

    listed = await client.approvals.list()
    assert approval["id"] in [a["id"] for a in listed]
    got = await client.approvals.get(approval["id"])
    assert got["arguments"] == {"path": "a.md", "content": "hello\n"}
    assert toolmesh.ApprovalRequest.model_validate(got).status == "pending"

    pending = await write(client, "a.md", approval=approval["id"])
    assert pending["error"] == "approval_pending", pending
    assert not (workspace(node, client) / "a.md").exists()

    decided = await client.approvals.decide(approval["id"], True, approver="pytest",
                                            reason="looks fine")
    assert decided["status"] == "approved"
    assert decided["decided_by"] == "pytest"
    assert decided["reason"] == "looks fine"
    assert approval["id"] not in [a["id"] for a in await client.approvals.list()]

    ran = await write(client, "a.md", approval=approval["id"])
    assert ran["ok"] is True, ran
    assert (workspace(node, client) / "a.md").read_text() == "hello\n"


async def test_a_parked_call_runs_once_another_client_approves(
    node: NodeInfo, client: toolmesh.Client
) -> None:
    inv = client.new_invocation_id()
    parked = asyncio.ensure_future(write(client, "b.md", wait_for_approval_s=60, invocation_id=inv))
    async with toolmesh.connect(node.nats_url, account=node.account) as approver:

        async def pending() -> dict | None:
            found = [a for a in await approver.approvals.list() if a["invocation_id"] == inv]
            return found[0] if found else None

        approval = await wait_until_async(pending, WITHIN, "the parked call's approval is listed")
        assert not parked.done(), "the call waits for the decision"
        await approver.approvals.decide(approval["id"], True, approver="second-client")
    reply = await asyncio.wait_for(parked, WITHIN)
    assert reply["ok"] is True, reply
    assert (workspace(node, client) / "b.md").exists()


async def test_a_rejected_approval_answers_approval_rejected(
    node: NodeInfo, client: toolmesh.Client
) -> None:
    gated = await write(client, "c.md")
    approval_id = gated["approval_request"]["id"]
    rejected = await client.approvals.decide(approval_id, False, reason="no")
    assert rejected["status"] == "rejected"
    reply = await write(client, "c.md", approval=approval_id)
    assert reply["error"] == "approval_rejected", reply
    assert not (workspace(node, client) / "c.md").exists()


async def test_management_failures_raise_toolmesh_error(client: toolmesh.Client) -> None:
    with pytest.raises(toolmesh.ToolmeshError) as missing:
        await client.approvals.get("appr_" + uuid.uuid4().hex)
    assert missing.value.code == "not_found"
    assert missing.value.message

    gated = await write(client, "d.md")
    approval_id = gated["approval_request"]["id"]
    await client.approvals.decide(approval_id, True)
    again = await client.approvals.decide(approval_id, True)
    assert again["status"] == "approved"
    with pytest.raises(toolmesh.ToolmeshError) as contrary:
        await client.approvals.decide(approval_id, False)
    assert contrary.value.code == "conflict"
    assert contrary.value.reply["ok"] is False


async def collect(events: toolmesh.EventStream) -> list[dict]:
    return [event async for event in events]


async def test_events_run_from_started_to_finished_in_seq_order(client: toolmesh.Client) -> None:
    inv = client.new_invocation_id()
    async with client.events(inv) as events:
        # In-band approval: the gated call also gives approval events.
        reply = await write(client, "e.md", invocation_id=inv, approval={"approved": True})
        assert reply["ok"] is True, reply
        got = await asyncio.wait_for(collect(events), WITHIN)
    assert [e["seq"] for e in got] == list(range(len(got)))
    kinds = [e["kind"] for e in got]
    assert kinds[0] == "started" and kinds[-1] == "finished", kinds
    assert "approved" in kinds, kinds
    assert got[-1]["ok"] is True
    for event in got:
        assert event["invocation_id"] == inv
        assert event["session_id"] == client.session
        assert (event["user_id"], event["agent_id"]) == ("u-pytest", "a-pytest")
        assert toolmesh.RunEvent.model_validate(event).tool == "write_workspace_file"


async def test_events_arriving_out_of_order_come_in_seq_order(client: toolmesh.Client) -> None:
    inv = client.new_invocation_id()
    subject = f"toolmesh.v1.events.{client.account}.{inv}"
    async with client.events(inv) as events:
        for seq, kind in [(1, "stdout"), (0, "started"), (3, "finished"), (2, "stderr")]:
            body = {"invocation_id": inv, "seq": seq, "kind": kind, "at": "2026-01-01T00:00:00Z"}
            await client.nats.publish(subject, json.dumps(body).encode())
        got = await asyncio.wait_for(collect(events), WITHIN)
    assert [(e["seq"], e["kind"]) for e in got] == [
        (0, "started"), (1, "stdout"), (2, "stderr"), (3, "finished")]


async def test_a_missing_event_is_skipped_after_the_reorder_window(client: toolmesh.Client) -> None:
    inv = client.new_invocation_id()
    subject = f"toolmesh.v1.events.{client.account}.{inv}"
    async with client.events(inv) as events:
        for seq, kind in [(0, "started"), (2, "finished")]:
            body = {"invocation_id": inv, "seq": seq, "kind": kind, "at": "2026-01-01T00:00:00Z"}
            await client.nats.publish(subject, json.dumps(body).encode())
        got = await asyncio.wait_for(collect(events), WITHIN)
    assert [e["seq"] for e in got] == [0, 2]


async def test_cancel_of_an_unknown_invocation_is_false(client: toolmesh.Client) -> None:
    assert await client.cancel(client.new_invocation_id()) is False


async def test_a_session_is_the_clients_own(node: NodeInfo) -> None:
    """Two clients of two sessions write the same path into two workspaces."""
    async with toolmesh.connect(node.nats_url, account=node.account, session=new_session()) as a, \
            toolmesh.connect(node.nats_url, account=node.account, session=new_session()) as b:
        for c in (a, b):
            reply = await write(c, "same.md", approval={"approved": True})
            assert reply["ok"] is True, reply
            assert (workspace(node, c) / "same.md").exists()
        assert workspace(node, a) != workspace(node, b)
