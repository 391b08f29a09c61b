"""A verifiers ToolEnv as its users write one: a Python function as the tool, a rubric on the
final answer."""

import verifiers as vf
from datasets import Dataset


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def load_environment(max_turns: int = 3):
    dataset = Dataset.from_list([{"question": f"What is {a} times 7?", "answer": str(7 * a)} for a in (3, 12, 25)])
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    return vf.ToolEnv(
        dataset=dataset,
        tools=[multiply],
        max_turns=max_turns,
        system_prompt="Use the multiply tool, then answer with the number only.",
        parser=parser,
        rubric=vf.Rubric(funcs=[correct], parser=parser),
    )
