"""What the three framework agent examples share: their command line, the toolmesh connection
and how a person decides an approval.

Not an example of its own: `langchain_agent.py`, `adk_agent.py` and `openai_agents_agent.py`
import it (Python finds it beside the script that runs).

Approvals (`--approvals`):

* `wait` (default): the tool call prints the approval id and the `toolmesh approvals` commands
  that decide it, and waits until someone decides (from another terminal, as the `approver`
  NATS user in the compose cluster, or in the approvals console); the call then goes on with
  that decision.
* `ask`: asks on this terminal and decides through `client.approvals` (the connection's NATS
  user must be allowed to decide, as on a node without NATS authorization).
* `off`: the `approval_required` reply goes to the model as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from typing import Optional

import toolmesh

DEFAULT_INCLUDE = "focused,write_workspace_file"
DEFAULT_PROMPT = ("Write a file hello.md holding a two-line poem about tool meshes, "
                  "then read it back and tell me what it says.")
INSTRUCTIONS = ("You work in the user's toolmesh workspace through the tools you have. "
                "Each tool answers JSON with `ok`; when `ok` is false, `error` and "
                "`error_message` say why. `approval_rejected` means a person said no: do not "
                "try again, tell the user.")
POLL_S = 1.0


def parse_args(description: str, default_model: str) -> argparse.Namespace:
    """The examples' command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT,
                        help="what to ask the agent (default: write and read back a file)")
    parser.add_argument("--model", default=default_model,
                        help=f"the model (default {default_model})")
    parser.add_argument("--account", default=os.environ.get("TOOLMESH_ACCOUNT", "acme"),
                        help="toolmesh account (default TOOLMESH_ACCOUNT, then acme)")
    parser.add_argument("--session", default=None,
                        help="session id, naming the workspace (default: a new one)")
    parser.add_argument("--include", default=DEFAULT_INCLUDE,
                        help="groups, profiles and tool names, comma-separated "
                             f"(default {DEFAULT_INCLUDE})")
    parser.add_argument("--approvals", choices=["wait", "ask", "off"], default="wait",
                        help="how approvals are decided (default wait; see agent_cli.py)")
    return parser.parse_args()


def require_env(*names: str, hint: str) -> None:
    """Exits 2 with `hint` unless one of the environment variables `names` is set."""
    if not any(os.environ.get(n) for n in names):
        print(f"{' or '.join(names)} is not set: {hint}", file=sys.stderr)
        sys.exit(2)


def require_module(module: str, install: str) -> None:
    """Exits 2 naming what to install when `module` cannot be imported."""
    try:
        __import__(module)
    except ImportError:
        print(f"{module} is not installed: pip install {install}", file=sys.stderr)
        sys.exit(2)


async def connect(args: argparse.Namespace) -> toolmesh.Client:
    """The client: `TOOLMESH_NATS_URL` (and `TOOLMESH_NATS_INBOX_PREFIX` for a NATS user
    confined to a private inbox, as in the compose cluster), read by the package."""
    session = args.session or "agent-" + uuid.uuid4().hex[:8]
    client = await toolmesh.connect(account=args.account, session=session,
                                    agent_id="example-agent")
    print(f"toolmesh: account {args.account}, session {session}", file=sys.stderr)
    return client


async def tools(client: toolmesh.Client, args: argparse.Namespace, adapter):
    """`adapter.get_tools` (`toolmesh.langchain`, `.adk` or `.openai_agents`) for `--include`,
    approvals decided as `--approvals` says."""
    return await adapter.get_tools(client, include=args.include,
                                   approve=approver(client, args.approvals))


def approver(client: toolmesh.Client, mode: str):
    """The `approve` hook for `get_tools` that `--approvals` names (None for `off`)."""

    def show(request: dict) -> None:
        print(f"\napproval needed: {request.get('tool_name')} (risk {request.get('risk_level')})"
              f"\n  arguments: {request.get('arguments_preview')}", file=sys.stderr)

    async def wait(request: dict) -> Optional[bool]:
        show(request)
        id, account = request["id"], client.account
        print(f"  approve: toolmesh approvals approve {id} --account {account}\n"
              f"  reject:  toolmesh approvals reject {id} --account {account}\n"
              "  waiting for a decision…", file=sys.stderr)
        while (await client.approvals.get(id))["status"] == "pending":
            await asyncio.sleep(POLL_S)
        return True  # the call goes on with whatever was decided

    async def ask(request: dict) -> Optional[bool]:
        show(request)
        answer = await asyncio.to_thread(input, "  approve? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    return {"wait": wait, "ask": ask, "off": None}[mode]


def show_reply(name: str, reply: object) -> None:
    """Prints one tool reply, short."""
    text = reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
    print(f"  {name} → {text[:200]}", file=sys.stderr)
