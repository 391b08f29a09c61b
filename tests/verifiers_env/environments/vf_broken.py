"""A verifiers MultiTurnEnv whose env_response raises: a bug in the environment, not the model."""

import verifiers as vf
from datasets import Dataset


class Broken(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        raise KeyError("board")


def load_environment():
    parser = vf.Parser()
    return Broken(
        dataset=Dataset.from_list([{"question": "Play.", "answer": "x"}]),
        max_turns=3,
        parser=parser,
        rubric=vf.Rubric(funcs=[lambda completion, **kwargs: 0.0], parser=parser),
    )
