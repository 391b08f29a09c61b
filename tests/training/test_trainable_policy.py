"""The trainer reads a policy through the Protocols in policies/base.py, not by attribute probing."""

from __future__ import annotations

import pytest

from agentgym_lightning.llm import Completion
from agentgym_lightning.policies.base import ModelSharingPolicy, Policy, TrainablePolicy, WeightLoadingPolicy
from agentgym_lightning.training.generation import shares_model, sync_weights


class _Answers(Policy):
    backend = "scripted"

    def generate(self, requests):
        return [Completion(text="ok") for _ in requests]


class _Engine(_Answers):
    """Holds weights elsewhere (like vllm): a path, a tokenizer and load_weights."""

    def __init__(self):
        self.path, self.tokenizer, self.loaded = "/weights", object(), None

    def load_weights(self, weights):
        self.loaded = dict(weights)


class _Sharing(_Answers):
    """Generates with the trained model itself (like hf)."""

    def __init__(self, model):
        self.path, self.tokenizer, self.hf_model, self.pad_token_id = "/weights", object(), model, 0


class _Model:
    def state_dict(self):
        return {}


def test_the_kinds_of_trainable_policy():
    model = _Model()
    assert not isinstance(_Answers(), TrainablePolicy)
    assert isinstance(_Engine(), WeightLoadingPolicy) and not isinstance(_Engine(), ModelSharingPolicy)
    assert isinstance(_Sharing(model), ModelSharingPolicy) and isinstance(_Sharing(model), TrainablePolicy)
    assert shares_model(_Sharing(model), model) and not shares_model(_Engine(), model)


def test_weights_go_to_a_weight_loading_policy_and_an_api_policy_is_refused():
    engine, model = _Engine(), _Model()
    assert sync_weights(engine, model, peft=False) >= 0 and engine.loaded == {}
    assert sync_weights(_Sharing(model), model, peft=False) == 0.0
    with pytest.raises(TypeError, match="neither share the trained model nor receive weights"):
        sync_weights(_Answers(), model, peft=False)
