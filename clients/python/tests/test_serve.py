"""Tools written with `toolmesh.Tool`, served by `toolmesh.serve`, called through the node's
gateway."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator

import toolmesh
from conftest import NodeInfo
from support import wait_until_async
from toolmesh.tools import clean_schema

WITHIN = 10.0


class EchoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, description="What to echo.")
    times: int = Field(default=1, ge=1, le=3)

    @field_validator("text")
    @classmethod
    def not_secret(cls, value: str) -> str:
        if value == "secret":
            raise ValueError("secret text is not echoed")
        return value


class Echo(toolmesh.Tool):
    name = "echo"
    description = "Echo the text, with the call's context."
    params = EchoParams
    risk_level = "low"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[EchoParams] = []

    async def __call__(self, params: EchoParams, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        self.calls.append(params)
        return toolmesh.ToolOk(output={
            "text": params.text * params.times,
            "invocation_id": ctx.invocation_id,
            "account": ctx.account,
            "session_id": ctx.session_id,
            "user_id": ctx.user_id,
            "agent_id": ctx.agent_id,
        })


class Empty(BaseModel):
    pass


class Refuse(toolmesh.Tool):
    name = "refuse"
    description = "Fail as a tool does."
    params = Empty
    risk_level = "low"

    async def __call__(self, params: Empty, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        return toolmesh.ToolError(message="the ticket system is down", output="partial",
                                  brief="down")


class Crash(toolmesh.Tool):
    name = "crash"
    description = "Raise an exception."
    params = Empty
    risk_level = "low"

    async def __call__(self, params: Empty, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        raise RuntimeError("disk on fire")


class Wait(toolmesh.Tool):
    name = "wait"
    description = "Wait until cancelled."
    params = Empty
    risk_level = "low"

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.seen: Optional[toolmesh.ToolContext] = None

    async def __call__(self, params: Empty, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        self.seen = ctx
        self.started.set()
        await asyncio.wait_for(ctx.cancelled.wait(), 60)
        return toolmesh.ToolError(message="cancelled")


class Address(BaseModel):
    city: str
    zip: str = Field(pattern=r"^[0-9]{5}$")


class ShipParams(BaseModel):
    to: Address
    speed: Literal["slow", "fast"] = "slow"


class Ship(toolmesh.Tool):
    name = "ship"
    description = "Ship a parcel (nested arguments)."
    params = ShipParams
    risk_level = "low"

    async def __call__(self, params: ShipParams, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        return toolmesh.ToolOk(output=params)


class Gated(toolmesh.Tool):
    name = "gated"
    description = "A medium-risk tool."
    params = Empty
    risk_level = "medium"
    side_effects = ["network_egress"]

    async def __call__(self, params: Empty, ctx: toolmesh.ToolContext) -> toolmesh.ToolResult:
        return toolmesh.ToolOk(output="ran")


def unique(tool_class: type, suffix: str, *args) -> toolmesh.Tool:
    """An instance of `tool_class` named `<name>_<suffix>`: tool names are global on the mesh,
    and a stopped provider's tools linger for up to 15 s."""
    named = type(tool_class.__name__, (tool_class,), {"name": f"{tool_class.name}_{suffix}"})
    return named(*args)


@pytest.fixture
def suffix() -> str:
    return uuid.uuid4().hex[:8]


async def known(client: toolmesh.Client, name: str) -> dict:
    """Waits until the gateway describes tool `name`; its description."""

    async def describe() -> Optional[dict]:
        reply = await client.call("tool_dispatcher", {"action": "describe", "tool_name": name})
        return reply["tool"] if reply.get("ok") else None

    return await wait_until_async(describe, WITHIN, f"the gateway knows {name}")


async def test_a_served_tool_is_found_and_called_through_the_gateway(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    echo = unique(Echo, suffix)
    async with toolmesh.serve([echo], service=f"py{suffix}", url=node.nats_url):
        described = await known(client, echo.name)
        assert described["execution"] == f"provider:py{suffix}"
        assert described["risk_level"] == "low"
        assert described["input_schema"]["properties"]["text"]["minLength"] == 1
        listed = await client.call("tool_dispatcher", {"action": "list", "include": ["external"]})
        assert echo.name in [t["name"] for t in listed["tools"]], listed

        inv = client.new_invocation_id()
        reply = await client.call(echo.name, {"text": "hi", "times": 2}, invocation_id=inv)
    assert reply["ok"] is True, reply
    assert reply["output"] == {
        "text": "hihi", "invocation_id": inv, "account": node.account,
        "session_id": client.session, "user_id": "u-pytest", "agent_id": "a-pytest",
    }


async def test_a_micro_service_without_a_description_is_found(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    """nats.py's `add_service` sets no description unless told: its `$SRV.INFO` then has none,
    and the gateway still finds the service's tools (it once ignored such a service)."""
    import nats
    from nats.micro import add_service

    name = f"plain_{suffix}"
    meta = {"description": "Say hello.", "input_schema": {"type": "object"}, "risk_level": "low"}

    async def hello(req) -> None:
        await req.respond(json.dumps({"ok": True, "hello": json.loads(req.data)["account"]}).encode())

    raw = await nats.connect(node.nats_url)
    try:
        service = await add_service(raw, name=f"raw{suffix}", version="1.0.0")
        info = await raw.request(f"$SRV.INFO.raw{suffix}", b"", timeout=WITHIN)
        assert not json.loads(info.data).get("description"), info.data
        await service.add_endpoint(name=name, subject=f"providers.raw{suffix}.{name}",
                                   handler=hello, metadata={"toolmesh.tool": json.dumps(meta)})
        await raw.publish("toolmesh.v1.providers.announce", b"{}")
        described = await known(client, name)
        assert described["execution"] == f"provider:raw{suffix}"
        reply = await client.call(name, {})
        assert reply["ok"] is True and reply["hello"] == node.account, reply
        await service.stop()
    finally:
        await raw.close()


async def test_bad_arguments_never_reach_the_tool(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    echo = unique(Echo, suffix)
    async with toolmesh.serve([echo], service=f"py{suffix}", url=node.nats_url):
        await known(client, echo.name)
        for arguments, path in [({"text": "hi", "times": 9}, "/times"),
                                ({"text": ""}, "/text"),
                                ({"text": "hi", "loud": True}, "/loud"),
                                ({}, "/text")]:
            reply = await client.call(echo.name, arguments)
            assert reply["error"] == "invalid_arguments", reply
            assert [d["path"] for d in reply["details"]] == [path], reply
        assert echo.calls == []
        assert (await client.call(echo.name, {"text": "ok"}))["ok"] is True
    assert len(echo.calls) == 1


async def test_what_only_the_model_checks_answers_invalid_arguments(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    echo = unique(Echo, suffix)
    async with toolmesh.serve([echo], service=f"py{suffix}", url=node.nats_url):
        await known(client, echo.name)
        reply = await client.call(echo.name, {"text": "secret"})
    assert reply["error"] == "invalid_arguments", reply
    assert reply["details"][0]["path"] == "/text"
    assert "secret text is not echoed" in reply["details"][0]["message"]
    assert echo.calls == []


async def test_tool_error_and_exceptions_answer_provider_error_without_a_traceback(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    refuse, crash = unique(Refuse, suffix), unique(Crash, suffix)
    async with toolmesh.serve([refuse, crash], service=f"py{suffix}", url=node.nats_url):
        await known(client, refuse.name)
        await known(client, crash.name)
        refused = await client.call(refuse.name)
        crashed = await client.call(crash.name)
    assert refused["ok"] is False
    assert refused["error"] == "provider_error"
    assert refused["error_message"] == "the ticket system is down"
    assert (refused["output"], refused["brief"]) == ("partial", "down")
    assert crashed["error"] == "provider_error", crashed
    assert crashed["error_message"] == "RuntimeError: disk on fire"
    assert "Traceback" not in json.dumps(crashed)
    assert ".py" not in json.dumps(crashed)


async def test_a_cancelled_call_sets_ctx_cancelled(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    wait = unique(Wait, suffix)
    async with toolmesh.serve([wait], service=f"py{suffix}", url=node.nats_url):
        await known(client, wait.name)
        inv = client.new_invocation_id()
        running = asyncio.ensure_future(client.call(wait.name, invocation_id=inv))
        await asyncio.wait_for(wait.started.wait(), WITHIN)
        assert wait.seen is not None and not wait.seen.cancelled.is_set()
        assert await client.cancel(inv) is True
        reply = await asyncio.wait_for(running, WITHIN)
        await asyncio.wait_for(wait.seen.cancelled.wait(), WITHIN)
    assert reply["error"] == "cancelled", reply
    assert wait.seen.invocation_id == inv
    assert await client.cancel(inv) is False


async def test_nested_params_become_one_schema_the_gateway_validates(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    ship = unique(Ship, suffix)
    schema = ship.input_schema()
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    async with toolmesh.serve([ship], service=f"py{suffix}", url=node.nats_url):
        await known(client, ship.name)
        bad = await client.call(ship.name, {"to": {"city": "Oslo", "zip": "oslo"}})
        good = await client.call(ship.name, {"to": {"city": "Oslo", "zip": "01500"}})
    assert bad["error"] == "invalid_arguments", bad
    assert bad["details"][0]["path"] == "/to/zip"
    assert good["output"] == {"to": {"city": "Oslo", "zip": "01500"}, "speed": "slow"}


async def test_a_medium_tool_needs_an_approval(
    node: NodeInfo, client: toolmesh.Client, suffix: str
) -> None:
    gated = unique(Gated, suffix)
    async with toolmesh.serve([gated], service=f"py{suffix}", url=node.nats_url):
        await known(client, gated.name)
        first = await client.call(gated.name)
        assert first["error"] == "approval_required", first
        assert first["approval_request"]["side_effects"] == ["network_egress"]
        approved = await client.call(gated.name, approval={"approved": True})
    assert approved["output"] == "ran", approved


def test_a_recursive_model_keeps_its_defs() -> None:
    class Node(BaseModel):
        label: str
        children: list["Node"] = []

    schema = clean_schema(Node.model_json_schema())
    assert schema["type"] == "object"
    assert "title" not in schema
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert schema["$defs"]["Node"]["properties"]["label"] == {"title": "Label", "type": "string"}


@pytest.mark.parametrize(
    "attributes, error, match",
    [
        ({"name": "bad name"}, ValueError, "name"),
        ({"name": "x" * 65}, ValueError, "name"),
        ({"risk_level": "extreme"}, ValueError, "risk_level"),
        ({"side_effects": ["launch_missiles"]}, ValueError, "side_effects"),
        ({"description": ""}, ValueError, "description"),
        ({"params": dict}, TypeError, "params"),
    ],
)
def test_a_bad_definition_is_refused_at_construction(attributes: dict, error: type,
                                                     match: str) -> None:
    broken = type("Broken", (Echo,), attributes)
    with pytest.raises(error, match=match):
        broken()


def test_a_tool_without_an_async_call_is_refused() -> None:
    class Sync(toolmesh.Tool):
        name = "sync"
        description = "Not async."
        params = Empty
        risk_level = "low"

        def __call__(self, params, ctx):  # type: ignore[override]
            return toolmesh.ToolOk()

    class Missing(toolmesh.Tool):
        name = "missing"
        description = "No call."
        params = Empty
        risk_level = "low"

    with pytest.raises(TypeError, match="async"):
        Sync()
    with pytest.raises(TypeError, match="__call__"):
        Missing()


async def test_serve_refuses_duplicates_and_reserved_subjects(node: NodeInfo) -> None:
    with pytest.raises(ValueError, match="repeated: echo"):
        await toolmesh.serve([Echo(), Echo()], service="dup", url=node.nats_url)
    for prefix in ("toolmesh.tools", "_INBOX.x", "$SRV", "a.*"):
        with pytest.raises(ValueError, match="subject_prefix"):
            await toolmesh.serve([Echo()], service="p", url=node.nats_url, subject_prefix=prefix)
    with pytest.raises(ValueError, match="service"):
        await toolmesh.serve([Echo()], service="a.b", url=node.nats_url)
