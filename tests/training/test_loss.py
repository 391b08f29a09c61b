"""The loss: hand-computed values on tiny tensors, and parity with TRL's GRPOTrainer on a real model."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from agentgym_lightning.training.loss import (
    LossOptions,
    PaddedBatch,
    loss_normalizer,
    micro_batches,
    pad_samples,
    per_token_logps,
    policy_loss,
)
from agentgym_lightning.training.samples import Sample

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the train extra (make setup)")


def batch_of(advantages, mask, weights, sampling=None):
    adv = torch.tensor(advantages, dtype=torch.float32)
    m = torch.tensor(mask, dtype=torch.float32)
    slp = torch.tensor(sampling, dtype=torch.float32) if sampling is not None else torch.full_like(adv, float("nan"))
    b, c = adv.shape
    return PaddedBatch(torch.zeros((b, c), dtype=torch.long), torch.ones((b, c), dtype=torch.long), m, adv, slp, torch.tensor(weights), c)


def test_on_policy_loss_is_minus_weighted_advantage_per_token():
    # ratio 1 (old = current): per-token loss = -A; grpo averages per row then over weights
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    b = batch_of([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]], [[1, 1, 0], [1, 0, 0]], [0.5, 1.0])
    grpo = policy_loss(logps, b, LossOptions("grpo", sampling_correction=False), normalizer=1.5)
    assert grpo.loss.item() == pytest.approx((0.5 * -2.0 + 1.0 * 1.0) / 1.5)
    dapo = policy_loss(logps, b, LossOptions("dapo", sampling_correction=False), normalizer=0.5 * 2 + 1.0 * 1)
    assert dapo.loss.item() == pytest.approx((0.5 * (-2.0 - 2.0) + 1.0 * 1.0) / 2.0)
    dapo.loss.backward()
    # d loss / d logp = -A * w / normalizer on loss tokens, 0 elsewhere
    assert logps.grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 0.5, 0.0, 0.0])


def test_clipping_and_the_sampling_correction():
    logps = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    old = torch.zeros((1, 2))
    b = batch_of([[1.0, -1.0]], [[1, 1]], [1.0], sampling=[[0.0, math.log(2.0)]])
    terms = policy_loss(logps, b, LossOptions("dapo", epsilon_low=0.2, epsilon_high=0.28, sampling_correction=False),
                        normalizer=2.0, old_logps=old)
    # token 0: ratio 1.5, A=+1 -> clipped to 1.28; token 1: ratio 0.5, A=-1 -> min(-0.5, -0.8) ... loss = -min(r*A, clip*A)
    assert float(terms.loss) == pytest.approx((-1.28 + 0.8) / 2.0)
    assert terms.clipped_high == 1 and terms.clipped_low == 1
    corrected = policy_loss(logps, b, LossOptions("dapo", epsilon_low=0.2, epsilon_high=0.28, sampling_correction=True,
                                                         sampling_correction_clip_max=3.0), normalizer=2.0, old_logps=old)
    # ratio exp(old - sampling): token 0 -> 1, token 1 -> exp(-log 2) = 0.5
    assert float(corrected.loss) == pytest.approx((-1.28 + 0.8 * 0.5) / 2.0)


def test_dr_grpo_and_cispo_and_kl():
    logps = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    b = batch_of([[1.0, 1.0]], [[1, 1]], [1.0])
    dr = policy_loss(logps, b, LossOptions("dr_grpo", sampling_correction=False), normalizer=1.0 * 8)
    assert float(dr.loss) == pytest.approx(-2.0 / 8)
    cispo = policy_loss(logps, b, LossOptions("cispo", epsilon_high=5.0, sampling_correction=False), normalizer=2.0)
    assert float(cispo.loss) == pytest.approx(-(1.0 * -1.0 * 2) / 2.0)  # -clamp(r) * A * logp
    ref = torch.tensor([[-1.5, -1.0]])
    kl = policy_loss(logps, b, LossOptions("dapo", beta=0.1, sampling_correction=False, use_bias_correction_kl=False),
                     normalizer=2.0, ref_logps=ref)
    k3 = math.exp(-0.5) - (-0.5) - 1
    assert float(kl.loss) == pytest.approx((-2.0 + 0.1 * k3) / 2.0)
    assert kl.kl_sum == pytest.approx(k3)


def test_the_normaliser_makes_micro_batching_exact():
    torch.manual_seed(0)
    samples = [
        Sample([1, 2], [3, 4, 5], [1, 1, 1], [-1.0] * 3, [0.5] * 3, 0.5, "a", "g"),
        Sample([1], [6], [1], [-1.0], [-1.0], 1.0, "b", "g"),
        Sample([2, 2, 2], [7, 8], [1, 0], [-1.0, float("nan")], [0.3, 0.0], 0.5, "a", "g"),
    ]
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        norm = loss_normalizer(samples, loss_type, max_completion_length=4)
        full = pad_samples(samples, 0)
        logps = -torch.rand(full.advantages.shape)
        whole = policy_loss(logps, full, LossOptions(loss_type, sampling_correction=False), normalizer=norm).loss
        parts = 0.0
        for i in range(3):  # one row at a time, each padded on its own
            part = pad_samples(samples[i : i + 1], 0)
            lp = logps[i : i + 1, : part.completion_width]
            parts += float(policy_loss(lp, part, LossOptions(loss_type, sampling_correction=False), normalizer=norm).loss)
        assert parts == pytest.approx(float(whole), abs=1e-6), loss_type


def row(prompt: int, completion: int, name: str) -> Sample:
    return Sample([1] * prompt, [2] * completion, [1] * completion, [-1.0] * completion, [0.0] * completion, 1.0, name, None)


def test_micro_batches_are_cut_by_rows_and_by_padded_tokens():
    short = [row(100, 20, f"s{i}") for i in range(5)]  # 120 tokens each
    long = [row(1400, 90, f"l{i}") for i in range(3)]  # 1,490 each: a multi-call episode's late call
    rows = short + long
    names = lambda batches: [[s.episode_id for s in b] for b in batches]  # noqa: E731
    # Rows only (the old behaviour): the three long rows share a micro-batch with two short ones.
    assert names(micro_batches(rows, 8)) == [[s.episode_id for s in rows]]
    # By tokens: padded size (rows x longest) stays within 3,000; every row is kept, in order.
    cut = micro_batches(rows, 8, 3000)
    assert names(cut) == [["s0", "s1", "s2", "s3", "s4"], ["l0", "l1"], ["l2"]]
    assert all(len(b) * max(len(s.prompt_ids) + len(s.completion_ids) for s in b) <= 3000 for b in cut)
    assert names(micro_batches(rows, 2, 3000)) == [["s0", "s1"], ["s2", "s3"], ["s4", "l0"], ["l1", "l2"]]
    # A row longer than the budget goes alone; the padded width counts the longest prompt and the
    # longest completion, even from different rows.
    assert names(micro_batches([row(10, 90, "a"), row(90, 10, "b"), row(5000, 1, "c")], 8, 150)) == [["a"], ["b"], ["c"]]
    assert micro_batches([], 8, 100) == []
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        micro_batches(rows, 8, 0)


def test_padding_layout():
    b = pad_samples([Sample([5, 6], [7], [1], [-0.1], [1.0], 1.0, "a", None), Sample([5], [8, 9], [1, 0], [-0.2, float("nan")], [2.0, 0.0], 0.5, "b", None)], 0)
    assert b.input_ids.tolist() == [[5, 6, 7, 0], [0, 5, 8, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert b.completion_mask.tolist() == [[1, 0], [1, 0]]
    assert b.weights.tolist() == [1.0, 0.5]


# ---------------------------------------------------------------------- parity with TRL


@pytest.fixture(scope="module")
def trl_trainer(tiny_model_dir, tmp_path_factory):
    """A real TRL GRPOTrainer around the tiny model (never trained: we call its loss)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    def build(loss_type, beta=0.0):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        args = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("trl")), use_cpu=True, bf16=False, per_device_train_batch_size=4,
            num_generations=2, max_completion_length=8, loss_type=loss_type, beta=beta, temperature=0.7,
            report_to=[], epsilon_high=5.0 if loss_type == "cispo" else None, logging_steps=1,
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
            train_dataset=Dataset.from_dict({"prompt": ["a"] * 4}), processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )
        trainer.model.eval()  # no gradient-accumulation scaling in TRL's loss
        return trainer

    return build


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo", "cispo"])
def test_loss_equals_trl_grpo_trainer_compute_loss(trl_trainer, loss_type):
    trainer = trl_trainer(loss_type, beta=0.04 if loss_type == "dapo" else 0.0)
    model = trainer.model
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(4):  # prompts of different lengths, completions of different lengths
        p = torch.randint(10, 1000, (3 + i,), generator=g).tolist()
        c = torch.randint(10, 1000, (2 + (i * 3) % 7,), generator=g).tolist()
        samples.append(Sample(p, c, [1] * len(c), [float("nan")] * len(c), [float(i) - 1.5] * len(c), 1.0, str(i), "g"))
    batch = pad_samples(samples, 0)
    p_width = batch.input_ids.shape[1] - batch.completion_width
    with torch.no_grad():
        current = per_token_logps(model, batch, 0.7, compute_entropy=False)[0]
    old = current + torch.randn(batch.advantages.shape, generator=g) * 0.3  # ratios around 1, some clipped
    ref = current - 0.05
    inputs = {
        "prompt_ids": batch.input_ids[:, :p_width], "prompt_mask": batch.attention_mask[:, :p_width],
        "completion_ids": batch.input_ids[:, p_width:], "completion_mask": batch.attention_mask[:, p_width:],
        "advantages": batch.advantages[:, 0], "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": batch.completion_mask.sum(),
    }
    theirs = trainer._compute_loss(model, inputs)
    logps, entropy = per_token_logps(model, batch, 0.7)
    options = LossOptions(loss_type, beta=trainer.beta, use_bias_correction_kl=trainer.args.use_bias_correction_kl, epsilon_low=0.2,
                          epsilon_high=5.0 if loss_type == "cispo" else 0.2, sampling_correction=False)
    ours = policy_loss(logps, batch, options, normalizer=loss_normalizer(samples, loss_type, 8), old_logps=old, ref_logps=ref)
    assert float(ours.loss) == pytest.approx(float(theirs), rel=1e-4, abs=1e-6)


def test_the_loss_options_are_the_configs_own():
    """The trainer calls the loss with the config's ``loss_options``: every option is the config's
    field of the same name (``epsilon_high``: the config's resolved upper bound)."""
    import dataclasses

    from agentgym_lightning.training import LightningRLConfig

    config = LightningRLConfig(loss_type="grpo", beta=0.04, use_bias_correction_kl=False, epsilon=0.1, epsilon_high=0.3, delta=2.0,
                               importance_sampling_level="sequence", sampling_correction=False, sampling_correction_mode="sequence_mask",
                               sampling_correction_clip_min=0.5, sampling_correction_clip_max=4.0, report_to=[])
    options = config.loss_options
    for f in dataclasses.fields(LossOptions):
        expected = {"epsilon_low": config.epsilon, "epsilon_high": config.epsilon_high}.get(f.name, getattr(config, f.name, None))
        assert getattr(options, f.name) == expected, f.name
    assert LightningRLConfig(epsilon=0.25, report_to=[]).loss_options.epsilon_high == 0.25  # defaults to epsilon
