#!/usr/bin/env python3
"""A LangGraph agent whose tools are toolmesh's (`toolmesh.langchain.get_tools`).

    pip install './clients/python[langchain]' langgraph langchain langchain-openai
    export OPENAI_API_KEY=…                      # or another provider: --model, its key
    export TOOLMESH_NATS_URL=nats://127.0.0.1:4222
    python3 examples/langchain_agent.py "What is in my workspace?"

The model is `init_chat_model(--model)` (`provider:model`, default openai:gpt-4.1-mini; an
`anthropic:…` model needs langchain-anthropic and ANTHROPIC_API_KEY, `google_genai:…`
langchain-google-genai and GOOGLE_API_KEY). The agent is LangChain's `create_agent` where the
`langchain` package has it, else LangGraph's `create_react_agent`. Each tool call goes through
the gateway; one that needs an approval waits for a person's decision (`--approvals`, see
agent_cli.py). Exits 2 when the model's key or a package is missing.
"""

import asyncio
import sys

import agent_cli

KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY",
        "google_genai": "GOOGLE_API_KEY", "mistralai": "MISTRAL_API_KEY"}


def make_agent(model, tools):
    """LangChain's `create_agent`, or LangGraph's `create_react_agent` without it."""
    try:
        from langchain.agents import create_agent
    except ImportError:
        from langgraph.prebuilt import create_react_agent
        return create_react_agent(model, tools, prompt=agent_cli.INSTRUCTIONS)
    return create_agent(model, tools, system_prompt=agent_cli.INSTRUCTIONS)


async def main() -> int:
    """Runs the agent on the prompt and prints its answer."""
    args = agent_cli.parse_args(__doc__.splitlines()[0], "openai:gpt-4.1-mini")
    provider = args.model.split(":", 1)[0] if ":" in args.model else "openai"
    if provider in KEYS:
        agent_cli.require_env(KEYS[provider], hint=f"the {provider} model needs its API key")
    agent_cli.require_module("langchain", "langchain langchain-openai")
    agent_cli.require_module("langgraph", "langgraph")
    from langchain.chat_models import init_chat_model

    import toolmesh.langchain

    model = init_chat_model(args.model)
    async with await agent_cli.connect(args) as client:
        tools = await agent_cli.tools(client, args, toolmesh.langchain)
        agent = make_agent(model, tools)
        result = await agent.ainvoke({"messages": [{"role": "user", "content": args.prompt}]})
        for message in result["messages"]:
            if message.type == "tool":
                agent_cli.show_reply(message.name, message.content)
        print(result["messages"][-1].content)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
