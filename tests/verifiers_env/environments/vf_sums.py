"""A verifiers SingleTurnEnv as its users write one (the classic API): a dataset of questions
and answers, a parser, a rubric of two reward functions with weights."""

import verifiers as vf
from datasets import Dataset


def load_environment(num_train: int = 4, num_eval: int = 2):
    def rows(start, count):
        return [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(start, start + count)]

    parser = vf.Parser()

    def exact_answer(completion, answer, **kwargs) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    def brief(completion, **kwargs) -> float:
        return float(len(parser.parse_answer(completion) or "") <= 8)

    rubric = vf.Rubric(funcs=[exact_answer, brief], weights=[1.0, 0.25], parser=parser)
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows(0, num_train)),
        eval_dataset=Dataset.from_list(rows(100, num_eval)),
        system_prompt="Answer with the number only.",
        parser=parser,
        rubric=rubric,
    )
