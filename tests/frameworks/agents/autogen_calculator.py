"""An AutoGen AgentChat agent as AutoGen's documentation writes it; the only thing handed in is
``model_client``.

Nothing here imports agentgym_lightning: the test runs this file unedited through the adapter.
"""

from autogen_agentchat.agents import AssistantAgent


def calculator(expression: str) -> str:
    """Compute an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - a test tool


async def agent(task, model_client):
    solver = AssistantAgent("solver", model_client=model_client, tools=[calculator], reflect_on_tool_use=True)
    result = await solver.run(task=task)
    return result.messages[-1].content
