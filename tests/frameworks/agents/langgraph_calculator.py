"""A LangGraph agent as LangGraph's documentation writes it; the only thing handed in is ``llm``.

Nothing here imports agentgym_lightning: the test runs this file unedited through the adapter.
"""

from typing import Annotated, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def calculator(expression: str) -> str:
    """Compute an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - a test tool


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(llm):
    model = llm.bind_tools([calculator])

    async def assistant(state: State):
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(State)
    graph.add_node("assistant", assistant)
    graph.add_node("tools", ToolNode([calculator]))
    graph.add_edge(START, "assistant")
    graph.add_conditional_edges("assistant", tools_condition)
    graph.add_edge("tools", "assistant")
    return graph.compile()


async def agent(task, llm):
    out = await build_graph(llm).ainvoke({"messages": [HumanMessage(task)]})
    return out["messages"][-1].content
