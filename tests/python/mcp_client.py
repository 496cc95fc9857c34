"""A real MCP client for the MCP front's tests (tests/it/mcp.rs), written with the official
Python SDK. It connects, runs the steps given, and prints one JSON line per step on stdout.

    mcp_client.py SPEC_JSON

SPEC: {"raw_post": URL, "token"?} (one bare POST; prints {"status"}), or {"http": URL, "token"?, "session"?,
"headers"?: {...} (sent with every request)} or {"stdio": [command, args...], "env"?: {...}};
"mode"?: "auto" (default: 2026-07-28 when the server has it) | "legacy" (initialize
handshake); "elicit"?: "accept" | "decline" | "cancel" (without it the client declares no
elicitation); "steps": [{"list": true} | {"call": NAME, "args"?: {...}, "progress"?: bool,
"cancel_after_progress"?: N, "input_responses"?, "request_state"?} |
{"call_once": NAME, "args"?} (one round: an InputRequiredResult is printed as "once") | {"wait_list_changed": S} | {"listen_changed": S}
(a subscriptions/listen stream, 2026-07-28) | {"wait_list_has": NAME, "within"?: S}].
A step line is {"step": i, ...}: for a list {"tools": [...]}, for a call {"result": {...},
"progress": [messages]} or {"cancelled": true, "progress": [...]}, for a failure {"error": text}.
A call with "progress" also prints {"progress_of": i, "message": text} as each notification
comes, for a test that waits for one while the call runs.
"""

import json
import sys

import anyio
import httpx2

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def raw_post(spec):
    """One bare POST of an initialize request: its HTTP status (401 checks)."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if spec.get("token"):
        headers["Authorization"] = "Bearer " + spec["token"]
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}}
    async with httpx2.AsyncClient() as http:
        response = await http.post(spec["raw_post"], json=body, headers=headers)
        emit({"status": response.status_code, "www_authenticate": response.headers.get("www-authenticate")})


async def main(spec):
    if "raw_post" in spec:
        await raw_post(spec)
        return
    kwargs = {"cache": None, "mode": spec.get("mode", "auto")}
    elicit = spec.get("elicit")
    asked = []
    if elicit:

        async def on_elicit(context, params):
            asked.append(dump(params))
            if elicit == "accept":
                return ElicitResult(action="accept", content={"approve": True})
            return ElicitResult(action=elicit)

        kwargs["elicitation_callback"] = on_elicit
    notices = []
    changed = anyio.Event()

    async def on_message(message):
        name = type(message).__name__
        notices.append(name)
        if name == "ToolListChangedNotification":
            changed.set()

    kwargs["message_handler"] = on_message
    if "http" in spec:
        headers = {}
        if spec.get("token"):
            headers["Authorization"] = "Bearer " + spec["token"]
        if spec.get("session"):
            headers["X-Toolmesh-Session"] = spec["session"]
        headers.update(spec.get("headers", {}))
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(300.0))
        server = streamable_http_client(spec["http"], http_client=http)
    else:
        command = spec["stdio"]
        server = StdioServerParameters(command=command[0], args=command[1:], env=spec.get("env"))
    async with Client(server, **kwargs) as client:
        emit({"connected": True, "protocol_version": client.protocol_version})
        for i, step in enumerate(spec["steps"]):
            try:
                if step.get("list"):
                    tools = await client.list_tools()
                    emit({"step": i, "tools": [dump(t) for t in tools.tools]})
                elif "call_once" in step:
                    # One round only: an InputRequiredResult comes back as it is.
                    result = await client.session.call_tool(
                        step["call_once"], step.get("args", {}), allow_input_required=True
                    )
                    emit({"step": i, "once": dump(result)})
                elif "wait_list_changed" in step:
                    with anyio.move_on_after(step["wait_list_changed"]):
                        await changed.wait()
                    emit({"step": i, "list_changed": changed.is_set(), "messages": notices})
                elif "listen_changed" in step:
                    heard, honored = False, None
                    with anyio.move_on_after(step["listen_changed"]):
                        async with client.listen(tools_list_changed=True) as sub:
                            honored = dump(sub.honored)
                            emit({"step": i, "listening": honored})
                            async for event in sub:
                                heard = type(event).__name__ == "ToolsListChanged"
                                break
                    emit({"step": i, "listen_changed": heard, "honored": honored})
                elif "wait_list_has" in step:
                    found = False
                    with anyio.move_on_after(step.get("within", 60)):
                        while not found:
                            tools = await client.list_tools()
                            found = any(t.name == step["wait_list_has"] for t in tools.tools)
                            if not found:
                                await anyio.sleep(0.5)
                    emit({"step": i, "found": found})
                else:
                    progress = []
                    cancel_after = step.get("cancel_after_progress")
                    done = anyio.Event()
                    outcome = {}

                    async def on_progress(value, total, message):
                        progress.append(message)
                        emit({"progress_of": i, "message": message})
                        if cancel_after is not None and len(progress) >= cancel_after:
                            done.set()

                    async def run():
                        try:
                            result = await client.call_tool(
                                step["call"],
                                step.get("args", {}),
                                progress_callback=on_progress if step.get("progress") else None,
                                input_responses=step.get("input_responses"),
                                request_state=step.get("request_state"),
                            )
                            outcome["result"] = dump(result)
                        finally:
                            done.set()

                    async with anyio.create_task_group() as group:
                        group.start_soon(run)
                        await done.wait()
                        if "result" not in outcome:
                            group.cancel_scope.cancel()
                    if "result" in outcome:
                        emit({"step": i, "result": outcome["result"], "progress": progress, "asked": asked})
                    else:
                        emit({"step": i, "cancelled": True, "progress": progress})
            except Exception as e:  # a step's failure is its line; the next step still runs
                emit({"step": i, "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    try:
        anyio.run(main, json.loads(sys.argv[1]))
    except BaseException as e:
        import traceback

        emit({"fatal": "".join(traceback.format_exception(e))[-3000:]})
        sys.exit(1)
