#!/usr/bin/env python3
"""An OpenAI Agents SDK agent whose tools are toolmesh's (`toolmesh.openai_agents.get_tools`).

    pip install './clients/python[openai-agents]'
    export OPENAI_API_KEY=…
    export TOOLMESH_NATS_URL=nats://127.0.0.1:4222
    python3 examples/openai_agents_agent.py "What is in my workspace?"

An Agents SDK `Agent` (model `--model`, default gpt-4.1-mini) runs with `Runner.run`; each tool
call and its reply print, then the answer. Each tool call goes through the gateway; one that
needs an approval waits for a person's decision (`--approvals`, see agent_cli.py). Exits 2
when OPENAI_API_KEY is not set.
"""

import asyncio
import sys

import agent_cli


async def main() -> int:
    """Runs the agent on the prompt and prints its tool replies and answer."""
    args = agent_cli.parse_args(__doc__.splitlines()[0], "gpt-4.1-mini")
    agent_cli.require_env("OPENAI_API_KEY", hint="the OpenAI model needs its API key")
    agent_cli.require_module("agents", "'./clients/python[openai-agents]'")
    from agents import Agent, Runner
    from agents.items import ToolCallItem, ToolCallOutputItem

    import toolmesh.openai_agents

    async with await agent_cli.connect(args) as client:
        tools = await agent_cli.tools(client, args, toolmesh.openai_agents)
        agent = Agent(name="toolmesh_agent", instructions=agent_cli.INSTRUCTIONS,
                      model=args.model, tools=tools)
        result = await Runner.run(agent, args.prompt)
        names = {}
        for item in result.new_items:
            if isinstance(item, ToolCallItem):
                names[getattr(item.raw_item, "call_id", None)] = getattr(item.raw_item, "name", "")
            elif isinstance(item, ToolCallOutputItem):
                agent_cli.show_reply(names.get(item.call_id, "tool"), item.output)
        print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
