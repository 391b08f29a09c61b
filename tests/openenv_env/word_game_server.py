"""An OpenEnv environment as its users write one (openenv-core: an Action and an Observation model,
an Environment, create_app), served by uvicorn on 127.0.0.1 for the tests.

The game: the observation names a target word; each action is a message; the reward is 1.0 when
the message is the word (and the episode ends), else -0.1; three tries at most.

``python word_game_server.py PORT [--crash]``: with ``--crash`` its step raises. Its ``app`` is
also what ``openenv:word_game_server`` serves in-process.
"""

import argparse
import random

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

WORDS = ["apple", "river", "stone", "cloud"]


class WordAction(Action):
    """Say a word."""

    message: str = Field(..., description="The word you say")


class WordObservation(Observation):
    instruction: str = Field(default="")
    last_message: str = Field(default="")


class WordGame(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    crash = False

    def __init__(self):
        self._state = State(episode_id="", step_count=0)
        self._target = WORDS[0]

    def reset(self, seed=None, episode_id=None, **kwargs) -> WordObservation:
        self._target = random.Random(seed).choice(WORDS)
        self._state = State(episode_id=episode_id or "", step_count=0)
        return WordObservation(instruction=f"Say the word {self._target}.", done=False, reward=0.0)

    def step(self, action: WordAction, **kwargs) -> WordObservation:
        if self.crash:
            raise RuntimeError("the game engine crashed")
        self._state.step_count += 1
        hit = action.message.strip().lower() == self._target
        done = hit or self._state.step_count >= 3
        return WordObservation(instruction=f"Say the word {self._target}.", last_message=action.message, done=done,
                               reward=1.0 if hit else -0.1)

    @property
    def state(self) -> State:
        return self._state


app = create_app(WordGame, WordAction, WordObservation, env_name="word_game", max_concurrent_envs=8)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--crash", action="store_true")
    args = parser.parse_args()
    WordGame.crash = args.crash
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
