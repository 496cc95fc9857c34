#!/usr/bin/env python3
"""A Google ADK agent whose tools are toolmesh's (`toolmesh.adk.get_tools`).

    pip install './clients/python[adk]'
    export GOOGLE_API_KEY=…                      # Gemini API; or Vertex AI, see below
    export TOOLMESH_NATS_URL=nats://127.0.0.1:4222
    python3 examples/adk_agent.py "What is in my workspace?"

An ADK `Agent` (model `--model`, default gemini-2.5-flash) runs under a `Runner` with an
`InMemorySessionService`; the events print as they come: each tool call, its reply, the answer.
For Vertex AI instead of an API key set GOOGLE_GENAI_USE_VERTEXAI=TRUE, GOOGLE_CLOUD_PROJECT and
GOOGLE_CLOUD_LOCATION. Each tool call goes through the gateway; one that needs an approval waits
for a person's decision (`--approvals`, see agent_cli.py). Exits 2 when no key is set.
"""

import asyncio
import sys

import agent_cli

APP = "toolmesh-example"
USER = "example-user"


async def main() -> int:
    """Runs the agent on the prompt and prints its events and answer."""
    args = agent_cli.parse_args(__doc__.splitlines()[0], "gemini-2.5-flash")
    agent_cli.require_env("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI",
                          hint="the Gemini model needs an API key (or Vertex AI settings)")
    agent_cli.require_module("google.adk", "'./clients/python[adk]'")
    from google.adk.agents import Agent
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    import toolmesh.adk

    async with await agent_cli.connect(args) as client:
        tools = await agent_cli.tools(client, args, toolmesh.adk)
        agent = Agent(name="toolmesh_agent", model=args.model,
                      instruction=agent_cli.INSTRUCTIONS, tools=tools)
        sessions = InMemorySessionService()
        runner = Runner(app_name=APP, agent=agent, session_service=sessions)
        session = await sessions.create_session(app_name=APP, user_id=USER)
        message = types.Content(role="user", parts=[types.Part(text=args.prompt)])
        async for event in runner.run_async(user_id=USER, session_id=session.id,
                                            new_message=message):
            for part in event.content.parts if event.content and event.content.parts else []:
                if part.function_response:
                    agent_cli.show_reply(part.function_response.name,
                                         part.function_response.response)
                elif part.text and event.is_final_response():
                    print(part.text)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
