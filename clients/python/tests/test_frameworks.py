"""Framework tools against a real node: `toolmesh.langchain`, `toolmesh.adk` and
`toolmesh.openai_agents`.

The shared tests run once per framework through a `Framework` driver, which gets the tools,
reads what the model would see (name, description, input schema) and invokes a tool the way
that framework's runtime does: LangChain `ainvoke`, ADK `run_async` with a real `ToolContext`,
the Agents SDK `on_invoke_tool` with a real `ToolContext`. Every expectation is the gateway's
own answer (`tool_dispatcher` `list`/`describe`), read in the test through `client.call`. The
tests at the end run each framework's own agent loop with a scripted model.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import pytest

import toolmesh
from toolmesh import adk as tm_adk
from toolmesh import langchain as tm_langchain
from toolmesh import openai_agents as tm_openai

from agents import Agent as OpenAIAgent
from agents import FunctionTool, RunConfig, RunContextWrapper, Runner
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext as OpenAIToolContext
from google.adk.agents import LlmAgent
from google.adk.agents.invocation_context import InvocationContext, new_invocation_context_id
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner as AdkRunner
from google.adk.sessions import InMemorySessionService
from google.adk.tools import BaseTool as AdkBaseTool
from google.adk.tools.tool_context import ToolContext as AdkToolContext
from google.genai import types as genai
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool as LangChainBaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from openai.types.responses import ResponseFunctionToolCall

CatalogError = tm_langchain.CatalogError


# --- drivers -------------------------------------------------------------------------------


@dataclass
class Framework:
    """How one framework's tools are got, read and invoked."""

    name: str
    get_tools: Callable[..., Awaitable[list]]
    tool_class: type
    seen: Callable[[Any], tuple[str, str, dict]]
    invoke: Callable[[Any, dict], Awaitable[dict]]


async def langchain_invoke(tool: LangChainBaseTool, arguments: dict) -> dict:
    """`ainvoke` with the arguments: the ToolReply dict."""
    return await tool.ainvoke(arguments)


async def adk_context(tools: list) -> AdkToolContext:
    """A ToolContext as ADK's flow builds one: an invocation of an agent in a session of an
    in-memory session service, for one function call."""
    service = InMemorySessionService()
    session = await service.create_session(app_name="toolmesh-test", user_id="u-pytest")
    agent = LlmAgent(name="toolmesh_test", model="gemini-2.5-flash", tools=tools)
    invocation = InvocationContext(session_service=service, agent=agent, session=session,
                                   invocation_id=new_invocation_context_id())
    return AdkToolContext(invocation, function_call_id="fc-" + uuid.uuid4().hex[:8])


async def adk_invoke(tool: AdkBaseTool, arguments: dict) -> dict:
    """`run_async` with a real ToolContext: the ToolReply dict."""
    return await tool.run_async(args=arguments, tool_context=await adk_context([tool]))


def openai_context(tool: FunctionTool, args_json: str) -> OpenAIToolContext:
    """A ToolContext as the Agents SDK's runner builds one (`from_agent_context` on the run's
    context, for the model's function call)."""
    call = ResponseFunctionToolCall(type="function_call", name=tool.name, arguments=args_json,
                                    call_id="call-" + uuid.uuid4().hex[:8])
    agent = OpenAIAgent(name="toolmesh_test", tools=[tool])
    return OpenAIToolContext.from_agent_context(RunContextWrapper(context=None), call.call_id,
                                                tool_call=call, agent=agent)


async def openai_invoke_text(tool: FunctionTool, args_json: str) -> str:
    """`on_invoke_tool` with the arguments' JSON text, as the runner calls it."""
    return await tool.on_invoke_tool(openai_context(tool, args_json), args_json)


async def openai_invoke(tool: FunctionTool, arguments: dict) -> dict:
    """`on_invoke_tool` with the arguments as JSON text: the reply parsed back."""
    text = await openai_invoke_text(tool, json.dumps(arguments))
    assert isinstance(text, str)
    return json.loads(text)


def adk_seen(tool: AdkBaseTool) -> tuple[str, str, dict]:
    declaration = tool._get_declaration()
    assert isinstance(declaration, genai.FunctionDeclaration)
    return declaration.name, declaration.description, declaration.parameters_json_schema


FRAMEWORKS = [
    Framework("langchain", tm_langchain.get_tools, LangChainBaseTool,
              lambda t: (t.name, t.description, t.args_schema), langchain_invoke),
    Framework("adk", tm_adk.get_tools, AdkBaseTool, adk_seen, adk_invoke),
    Framework("openai_agents", tm_openai.get_tools, FunctionTool,
              lambda t: (t.name, t.description, t.params_json_schema), openai_invoke),
]


@pytest.fixture(params=FRAMEWORKS, ids=[f.name for f in FRAMEWORKS])
def fw(request: pytest.FixtureRequest) -> Framework:
    """Each framework in turn."""
    return request.param


# --- the gateway's own answers -------------------------------------------------------------


async def listed(client: toolmesh.Client, include: list[str]) -> list[dict]:
    """`tool_dispatcher` `list` for `include`."""
    reply = await client.call("tool_dispatcher", {"action": "list", "include": include})
    assert reply["ok"], reply
    return reply["tools"]


async def described(client: toolmesh.Client, name: str) -> dict:
    """`tool_dispatcher` `describe` of one tool."""
    reply = await client.call("tool_dispatcher",
                              {"action": "describe", "tool_name": name, "include": [name]})
    assert reply["ok"], reply
    return reply["tool"]


def by_name(tools: list) -> dict[str, Any]:
    return {t.name: t for t in tools}


async def read_text(fw: Framework, client: toolmesh.Client, path: str) -> dict:
    """Reads `path` through the framework's `read_workspace_file` tool."""
    (read,) = await fw.get_tools(client, include=["read_workspace_file"])
    return await fw.invoke(read, {"path": path, "include_line_numbers": False})


# --- what the tools are --------------------------------------------------------------------


async def test_default_is_the_focused_profile_as_framework_tools(fw: Framework, client) -> None:
    """Without `include` the tools are the `focused` profile's, in the gateway's order, each
    an instance of the framework's own tool class."""
    tools = await fw.get_tools(client)
    assert all(isinstance(t, fw.tool_class) for t in tools)
    expected = [t["name"] for t in await listed(client, ["focused"])]
    assert [t.name for t in tools] == expected
    assert "read_workspace_file" in expected and "tool_dispatcher" not in expected


async def test_names_descriptions_and_schemas_are_the_gateways(fw: Framework, client) -> None:
    """What the model sees of each tool is what `describe` gives: name, description and the
    input JSON Schema the gateway validates with."""
    tools = await fw.get_tools(client, include=["focused", "workspace"])
    assert tools
    for tool in tools:
        spec = await described(client, tool.name)
        assert fw.seen(tool) == (spec["name"], spec["description"], spec["input_schema"])


async def test_a_group_gives_its_tools(fw: Framework, client) -> None:
    """A group in `include` gives exactly the tools `list` gives for it."""
    tools = await fw.get_tools(client, include=["workspace"])
    expected = await listed(client, ["workspace"])
    assert [t.name for t in tools] == [t["name"] for t in expected]
    assert {t["group"] for t in expected} == {"workspace"}
    assert "write_workspace_file" in by_name(tools) and "component_status" not in by_name(tools)


async def test_a_tool_name_gives_that_tool(fw: Framework, client) -> None:
    """A tool name gives that tool; one comma-separated string is several names."""
    tools = await fw.get_tools(client, include=["write_workspace_file"])
    assert [t.name for t in tools] == ["write_workspace_file"]
    tools = await fw.get_tools(client, include="workspace_status, component_status")
    assert sorted(t.name for t in tools) == ["component_status", "workspace_status"]


@pytest.mark.parametrize("include, says", [
    (["no_such_tool"], "no_such_tool"),
    (["focused", "no_such_tool"], "no_such_tool"),
    (["mcp"], "selects no tool"),
    ([], "names nothing"),
], ids=["unknown", "unknown-beside-known", "empty-group", "empty"])
async def test_an_include_naming_nothing_raises(fw: Framework, client, include, says) -> None:
    """An item that is no group, profile or tool, or an include that selects no tool, raises
    `CatalogError` (a `ValueError` and a `toolmesh.ToolmeshError`) saying what is wrong."""
    with pytest.raises(CatalogError) as raised:
        await fw.get_tools(client, include=include)
    assert raised.value.code == "invalid_arguments"
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, toolmesh.ToolmeshError)


async def test_the_dispatcher_is_a_tool_when_named(fw: Framework, client) -> None:
    """`tool_dispatcher` (or its alias) in `include` adds the dispatcher, last; through it the
    model lists, describes and calls the other tools, and the gateway validates its calls."""
    tools = await fw.get_tools(client, include=["focused", "agentengine_tool_dispatcher"])
    focused = [t["name"] for t in await listed(client, ["focused"])]
    assert [t.name for t in tools] == focused + ["agentengine_tool_dispatcher"]
    dispatcher = tools[-1]
    assert isinstance(dispatcher, fw.tool_class)
    name, _, schema = fw.seen(dispatcher)
    assert name == "agentengine_tool_dispatcher"
    assert set(schema["properties"]) == {"action", "tool_name", "arguments", "include", "profile"}

    reply = await fw.invoke(dispatcher, {"action": "describe", "tool_name": "read_workspace_file",
                                         "include": ["workspace"], "profile": "coding",
                                         "arguments": None})
    assert reply["ok"] and reply["tool"] == await described(client, "read_workspace_file")
    reply = await fw.invoke(dispatcher, {"action": "call", "tool_name": "workspace_status"})
    assert reply["ok"] and reply["dispatched_tool_name"] == "workspace_status"
    reply = await fw.invoke(dispatcher, {"action": "frob"})
    assert reply["error"] == "invalid_arguments" and reply["details"][0]["path"] == "/action"


# --- invoking ------------------------------------------------------------------------------


async def test_a_write_needs_approval_then_runs_and_reads_back(fw: Framework, client) -> None:
    """In strict mode a medium-risk write comes back as an `approval_required` reply, not an
    exception, and writes nothing; decided through `client.approvals` and repeated through the
    client with the approval, it writes, and the framework's read tool shows the content."""
    tools = by_name(await fw.get_tools(client, include=["workspace"]))
    path, text = f"notes/{fw.name}.md", f"hello from {fw.name}\n"
    arguments = {"path": path, "content": text}

    reply = await fw.invoke(tools["write_workspace_file"], arguments)
    assert reply["ok"] is False and reply["error"] == "approval_required"
    assert reply["type"] == "approval_required" and reply["approval_required"] is True
    request = reply["approval_request"]
    assert request["tool_name"] == "write_workspace_file" and request["status"] == "pending"
    assert request["risk_level"] == "medium" and request["session_id"] == client.session
    assert (await read_text(fw, client, path))["error"] == "not_found"

    decided = await client.approvals.decide(request["id"], True)
    assert decided["status"] == "approved"
    written = await client.call("write_workspace_file", arguments,
                                approval={"id": request["id"]})
    assert written["ok"], written

    read = await fw.invoke(tools["read_workspace_file"],
                           {"path": path, "include_line_numbers": False})
    assert read["ok"] and read["content"] == text


async def test_an_approve_hook_decides_and_repeats_the_call(fw: Framework, client) -> None:
    """With `approve`, the tool hands the approval request to it: `True` approves through
    `client.approvals` and repeats the call, which runs; `False` rejects it
    (`approval_rejected`); `None` leaves it pending and returns `approval_required`."""
    seen: list[dict] = []
    verdict: list = [True]

    async def approve(request: dict):
        seen.append(request)
        return verdict[0]

    (write,) = await fw.get_tools(client, include=["write_workspace_file"], approve=approve)

    reply = await fw.invoke(write, {"path": "approved.txt", "content": "yes\n"})
    assert reply["ok"], reply
    assert seen[-1]["tool_name"] == "write_workspace_file"
    approved = await client.approvals.get(seen[-1]["id"])
    assert approved["status"] == "used" and approved["arguments"]["path"] == "approved.txt"
    assert (await read_text(fw, client, "approved.txt"))["content"] == "yes\n"

    verdict[0] = False
    reply = await fw.invoke(write, {"path": "rejected.txt", "content": "no\n"})
    assert reply["error"] == "approval_rejected"
    assert (await read_text(fw, client, "rejected.txt"))["error"] == "not_found"

    verdict[0] = None
    reply = await fw.invoke(write, {"path": "pending.txt", "content": "later\n"})
    assert reply["error"] == "approval_required"
    assert (await client.approvals.get(reply["approval_request"]["id"]))["status"] == "pending"
    assert len(seen) == 3


@pytest.mark.parametrize("decision", [True, False], ids=["approved", "rejected"])
async def test_an_approve_hook_may_wait_for_a_persons_decision(
        fw: Framework, client, decision: bool) -> None:
    """A hook that waits until a person decided elsewhere (here: a second client, as the
    `toolmesh approvals` CLI would) and returns `True` makes the call go on with that
    decision: it runs when approved, and answers `approval_rejected` when rejected."""
    async def person_decides_then_go_on(request: dict) -> bool:
        await client.approvals.decide(request["id"], decision, approver="a-person")
        return True

    (write,) = await fw.get_tools(client, include=["write_workspace_file"],
                                  approve=person_decides_then_go_on)
    reply = await fw.invoke(write, {"path": "decided.txt", "content": "by a person\n"})
    found = await read_text(fw, client, "decided.txt")
    if decision:
        assert reply["ok"] is True and found["content"] == "by a person\n"
    else:
        assert reply["error"] == "approval_rejected" and found["error"] == "not_found"


async def test_invalid_arguments_come_back_from_the_gateway(fw: Framework, client) -> None:
    """Arguments that break the schema come back as the gateway's `invalid_arguments` reply,
    with the JSON pointer of each problem."""
    (read,) = await fw.get_tools(client, include=["read_workspace_file"])
    reply = await fw.invoke(read, {"path": 5})
    assert reply["ok"] is False and reply["error"] == "invalid_arguments"
    assert reply["invocation_id"].startswith("inv")
    assert [d["path"] for d in reply["details"]] == ["/path"]
    reply = await fw.invoke(read, {})
    assert reply["error"] == "invalid_arguments" and reply["details"][0]["path"] == "/path"


# --- each framework's own ways --------------------------------------------------------------


async def test_langchain_tool_call_gives_a_tool_message(client) -> None:
    """Invoked with a tool call, a LangChain tool returns a `ToolMessage` for that call: the
    reply's JSON text as content, the reply dict as artifact; sync `invoke` refuses."""
    (status,) = await tm_langchain.get_tools(client, include=["workspace_status"])
    message = await status.ainvoke({"name": "workspace_status", "args": {}, "id": "call-1",
                                    "type": "tool_call"})
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "call-1" and message.name == "workspace_status"
    assert isinstance(message.content, str)
    assert json.loads(message.content) == message.artifact
    assert message.artifact["ok"] is True and "root" in message.artifact
    with pytest.raises(NotImplementedError):
        status.invoke({})


async def test_langgraph_tool_node_runs_the_tools(client) -> None:
    """LangGraph's `ToolNode`, in a graph, runs the model's tool calls into `ToolMessage`s;
    the schema the model is bound with is the gateway's. (LangGraph is in the package's `test`
    extra, not its `langchain` one, which needs only langchain-core.)"""
    import langgraph.graph as graph_module
    from langgraph.prebuilt import ToolNode
    tools = await tm_langchain.get_tools(client, include=["workspace"])
    bound = convert_to_openai_tool(by_name(tools)["read_workspace_file"])
    schema = (await described(client, "read_workspace_file"))["input_schema"]
    assert bound["function"]["parameters"]["properties"] == schema["properties"]
    assert bound["function"]["parameters"]["required"] == schema["required"]

    calls = [{"name": "workspace_status", "args": {}, "id": "c1", "type": "tool_call"},
             {"name": "write_workspace_file", "args": {"path": "x.txt", "content": "x"},
              "id": "c2", "type": "tool_call"}]
    graph = graph_module.StateGraph(graph_module.MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(graph_module.START, "tools")
    graph.add_edge("tools", graph_module.END)
    out = await graph.compile().ainvoke(
        {"messages": [AIMessage(content="", tool_calls=calls)]})
    messages = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert messages["c1"].artifact["ok"] is True
    assert messages["c2"].artifact["error"] == "approval_required"
    assert json.loads(messages["c2"].content)["approval_request"]["tool_name"] == \
        "write_workspace_file"


async def test_openai_agents_malformed_arguments_never_reach_the_gateway(client) -> None:
    """Arguments text that is not a JSON object answers an `invalid_arguments` reply made by
    the client (no `invocation_id`: no call was made); empty text is `{}`."""
    (status,) = await tm_openai.get_tools(client, include=["workspace_status"])
    for text in ("{not json", "[1, 2]"):
        reply = json.loads(await openai_invoke_text(status, text))
        assert reply["error"] == "invalid_arguments" and "invocation_id" not in reply
    reply = json.loads(await openai_invoke_text(status, ""))
    assert reply["ok"] is True


async def test_openai_agents_runner_calls_the_tools(client) -> None:
    """`Runner.run` with a scripted model: the model is offered the tools, its function call
    runs through the gateway, and the output item holds the reply's JSON text."""
    tools = await tm_openai.get_tools(client, include=["focused"])
    model = ScriptedModel([
        [function_call("workspace_status", {}, call_id="call-1")],
        [assistant_message("done")],
    ])
    agent = OpenAIAgent(name="toolmesh_test", instructions="Use the tools.", tools=tools,
                        model=model)
    result = await Runner.run(agent, "What is in the workspace?",
                              run_config=RunConfig(tracing_disabled=True))
    assert result.final_output == "done"
    assert [t.name for t in model.first_call.tools] == [t.name for t in tools]
    (output,) = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert json.loads(output.output)["ok"] is True and "root" in json.loads(output.output)


class ScriptedLlm(BaseLlm):
    """An ADK model that answers each turn from a script and keeps the requests it got."""

    script: list = []
    requests: list = []

    async def generate_content_async(self, llm_request, stream: bool = False):
        """Answers the next scripted content."""
        self.requests.append(llm_request)
        yield LlmResponse(content=self.script.pop(0))


async def test_adk_runner_calls_the_tools(client) -> None:
    """An ADK `Runner` with a scripted model: the request carries each tool's declaration,
    the model's function call runs through the gateway, and the function response is the
    ToolReply."""
    tools = await tm_adk.get_tools(client, include=["focused"])
    call = genai.FunctionCall(id="fc-1", name="workspace_status", args={})
    llm = ScriptedLlm(model="scripted", script=[
        genai.Content(role="model", parts=[genai.Part(function_call=call)]),
        genai.Content(role="model", parts=[genai.Part(text="done")]),
    ], requests=[])
    agent = LlmAgent(name="toolmesh_test", model=llm, instruction="Use the tools.", tools=tools)
    service = InMemorySessionService()
    runner = AdkRunner(app_name="toolmesh-test", agent=agent, session_service=service)
    session = await service.create_session(app_name="toolmesh-test", user_id="u-pytest")
    events = [e async for e in runner.run_async(
        user_id="u-pytest", session_id=session.id,
        new_message=genai.Content(role="user", parts=[genai.Part(text="What is there?")]))]

    declared = {d.name for t in llm.requests[0].config.tools for d in t.function_declarations}
    assert declared == {t.name for t in tools}
    responses = [p.function_response for e in events for p in (e.content.parts if e.content
                 else []) if p.function_response]
    assert [r.name for r in responses] == ["workspace_status"]
    assert responses[0].response["ok"] is True and "root" in responses[0].response
    assert events[-1].content.parts[0].text == "done"
