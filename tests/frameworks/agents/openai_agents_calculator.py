"""An OpenAI Agents SDK agent as the SDK's documentation writes it; the only thing handed in is ``model``.

Nothing here imports agentgym_lightning: the test runs this file unedited through the adapter.
"""

from agents import Agent, Runner, function_tool


@function_tool
def calculator(expression: str) -> str:
    """Compute an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - a test tool


solver = Agent(name="solver", instructions="Use the calculator, then answer.", tools=[calculator])


async def agent(task, model):
    result = await Runner.run(solver.clone(model=model), task)
    return result.final_output
