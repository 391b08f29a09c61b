"""The decoupled objective (issue 31): the loss clips against the proximal policy (the weights
before the update) and weights each token by ``trunc(π_prox / π_behav)`` against the behaviour
policy whose logprobs the call carries.

* With current behaviour logprobs (every call answered by the weights being updated, the
  generator sharing them) the loss and its gradients are the on-policy loss's, for every loss type.
* A hand-computed stale case: the weight, its truncation (and masking), the gradient, the metrics.
* The loss against AReaL's formula, written out here, on random stale tensors.
* The clip counts use ``π_θ / π_prox``, never the behaviour policy.
* Through :class:`~agentgym_lightning.training.update.MicroBatches` on a real (tiny) model, on the
  token-tree, padded and LoRA-per-agent paths: the proximal policy is the weights the update starts
  from, with ``num_iterations`` 1 and 2.
"""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

from agentgym_lightning.training.loss import LossOptions, PaddedBatch, pad_samples, per_token_logps, policy_loss
from agentgym_lightning.training.samples import Sample

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the train extra (make setup)"),
    pytest.mark.usefixtures("one_thread"),
]

NAN = float("nan")
LOSSES = [(t, level) for t in ("grpo", "dr_grpo", "dapo", "cispo") for level in ("token", "sequence")]


def batch_of(advantages, mask, sampling, weights=None) -> PaddedBatch:
    adv = torch.as_tensor(advantages, dtype=torch.float32)
    b, c = adv.shape
    w = torch.tensor(weights if weights is not None else [1.0] * b)
    return PaddedBatch(torch.zeros((b, c), dtype=torch.long), torch.ones((b, c), dtype=torch.long), torch.as_tensor(mask, dtype=torch.float32),
                       adv, torch.as_tensor(sampling, dtype=torch.float32), w, c)


def options(loss_type="dapo", level="token", **kw) -> LossOptions:
    return LossOptions(loss_type, importance_sampling_level=level, epsilon_low=0.2, epsilon_high=5.0 if loss_type == "cispo" else 0.28, **kw)


def loss_and_grad(logps: torch.Tensor, batch: PaddedBatch, opts: LossOptions, **kw):
    leaf = logps.detach().clone().requires_grad_(True)
    terms = policy_loss(leaf, batch, opts, **kw)
    terms.loss.backward()
    terms.loss = terms.loss.detach()
    return terms, leaf.grad


def random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand((3, 5), generator=g) * 3
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 0, 1, 1, 1]], dtype=torch.float32)
    adv = (torch.randn((3, 1), generator=g) * mask).expand(3, 5).clone() * mask
    return g, logps, mask, adv


# ------------------------------------------------------------------ current calls: the on-policy loss


@pytest.mark.parametrize("loss_type, level", LOSSES)
def test_current_behaviour_logprobs_give_the_synchronous_loss_and_gradients(loss_type, level):
    """Every call answered by the weights being updated (k = 0 with a generator that shares them,
    or any k when a call's version is current): the behaviour weight is 1, and the loss and its
    gradients are those of the plain on-policy loss, with and without a proximal policy apart
    from the trained one (``num_iterations > 1``)."""
    g, logps, mask, adv = random_batch(7)
    sync = batch_of(adv, mask, torch.full_like(logps, NAN))
    norm = 4.0
    for old in (None, logps + 0.3 * torch.randn(logps.shape, generator=g)):
        proximal = logps if old is None else old
        current = batch_of(adv, mask, proximal)  # behaviour = proximal on every loss token
        plain, plain_grad = loss_and_grad(logps, sync, options(loss_type, level, sampling_correction=False), normalizer=norm, old_logps=old)
        decoupled, grad = loss_and_grad(logps, current, options(loss_type, level), normalizer=norm, old_logps=old)
        assert float(decoupled.loss) == pytest.approx(float(plain.loss), rel=1e-6, abs=1e-7)
        torch.testing.assert_close(grad, plain_grad, rtol=1e-6, atol=1e-7)
        assert decoupled.sampling_ratio_sum == pytest.approx(decoupled.tokens)
        assert decoupled.sampling_truncated == 0.0
        assert (decoupled.clipped_low, decoupled.clipped_high) == (plain.clipped_low, plain.clipped_high)


# ------------------------------------------------------------------ stale calls: by hand


def test_a_stale_call_is_weighted_by_the_truncated_proximal_over_behaviour_ratio():
    """One row of four loss tokens, num_iterations = 1 (π_θ = π_prox = the current logprobs).
    The behaviour policy gave token 0 probability 0.05 where the current one gives 0.5 (weight 10,
    truncated to 3), token 1 the same as now (1), token 2 0.6 for 0.3 (0.5), token 3 0.2 for 0.3 (1.5)."""
    current = torch.tensor([[math.log(0.5), math.log(0.4), math.log(0.3), math.log(0.3)]])
    behaviour = torch.tensor([[math.log(0.05), math.log(0.4), math.log(0.6), math.log(0.2)]])
    adv = [[1.0, -1.0, 2.0, 0.5]]
    batch = batch_of(adv, [[1, 1, 1, 1]], behaviour)
    terms, grad = loss_and_grad(current, batch, options("dapo", sampling_correction_clip_max=3.0), normalizer=4.0)
    w = [3.0, 1.0, 0.5, 1.5]
    # u = 1: loss = -Σ w·A / 4, d loss / d logp = -w·A / 4
    assert float(terms.loss) == pytest.approx(-(3.0 * 1.0 + 1.0 * -1.0 + 0.5 * 2.0 + 1.5 * 0.5) / 4.0)
    assert grad.flatten().tolist() == pytest.approx([-3.0 / 4, 1.0 / 4, -1.0 / 4, -0.75 / 4])
    assert terms.sampling_ratio_sum == pytest.approx(sum(w))
    assert terms.sampling_truncated == 1.0  # token 0 only
    assert terms.clipped_low == terms.clipped_high == 0.0  # the proximal ratio is 1: nothing clipped for age

    # AReaL's behav_imp_weight_cap (mode token_mask): token 0 is dropped instead of truncated.
    masked, masked_grad = loss_and_grad(current, batch, options("dapo", sampling_correction_mode="token_mask"), normalizer=4.0)
    assert float(masked.loss) == pytest.approx(-(0.0 + 1.0 * -1.0 + 0.5 * 2.0 + 1.5 * 0.5) / 4.0)
    assert masked_grad.flatten().tolist() == pytest.approx([0.0, 1.0 / 4, -1.0 / 4, -0.75 / 4])
    assert masked.sampling_ratio_sum == pytest.approx(3.0) and masked.sampling_truncated == 1.0

    # A lower bound too: token 2's weight 0.5 is raised to 0.8.
    both, _ = loss_and_grad(current, batch, options("dapo", sampling_correction_clip_min=0.8), normalizer=4.0)
    assert both.sampling_ratio_sum == pytest.approx(3.0 + 1.0 + 0.8 + 1.5) and both.sampling_truncated == 2.0

    # Per sequence: one weight, exp(Σ log w) = 10 · 1 · 0.5 · 1.5 = 7.5, truncated to 3 on all four tokens.
    seq, _ = loss_and_grad(current, batch, options("dapo", sampling_correction_mode="sequence_truncate"), normalizer=4.0)
    assert float(seq.loss) == pytest.approx(-3.0 * (1.0 - 1.0 + 2.0 + 0.5) / 4.0)
    assert seq.sampling_ratio_sum == pytest.approx(12.0) and seq.sampling_truncated == 4.0


def test_the_clip_counts_use_the_proximal_ratio_not_the_behaviour_one():
    """Behaviour logprobs far from the proximal ones (weights of 20, or of 0.5, 0.05 and 1) clip
    nothing by themselves; a proximal ratio out of [0.8, 1.28] clips, whatever the behaviour policy."""
    theta = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.5)]])
    proximal = torch.tensor([[math.log(0.5), math.log(0.25), math.log(1.0)]])  # u = 1, 2, 0.5
    adv = [[1.0, 1.0, -1.0]]
    for behaviour in ([[math.log(0.025), math.log(0.0125), math.log(0.05)]], [[0.0, math.log(0.25) + 3.0, 0.0]], proximal):
        batch = batch_of(adv, [[1, 1, 1]], behaviour)
        terms, _ = loss_and_grad(theta, batch, options("dapo", sampling_correction_clip_max=1e9), normalizer=3.0, old_logps=proximal)
        assert (terms.clipped_low, terms.clipped_high) == (1.0, 1.0), behaviour
        assert terms.ratio_sum == pytest.approx(1.0 + 2.0 + 0.5)
        w = torch.exp(proximal - torch.as_tensor(behaviour)).flatten().tolist()
        # token 0: u = 1 -> -w·A; token 1: u = 2 > 1.28, A > 0 -> clipped, -w·1.28; token 2: u = 0.5 < 0.8, A < 0 -> -w·(-0.8)
        assert float(terms.loss) == pytest.approx(-(w[0] * 1.0 + w[1] * 1.28 + w[2] * -0.8) / 3.0, rel=1e-5)


def areal_decoupled_loss(logps, proximal, behaviour, adv, mask, eps_low, eps_high, cap):
    """AReaL's decoupled PPO actor loss (``ppo_actor_loss_fn`` with ``use_decoupled_loss``), written
    out from its definition for token-level ratios: token-mean over the loss tokens, the
    behaviour weight's tokens over ``cap`` dropped."""
    ratio = torch.exp(logps - proximal)
    pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    weight = torch.exp(proximal - behaviour)
    keep = (weight <= cap) & mask.bool()
    pg = pg * torch.where(keep, weight, torch.zeros_like(weight))
    return (pg * mask).sum() / mask.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_loss_is_areals_decoupled_objective_on_stale_rows(seed):
    g, logps, mask, adv = random_batch(seed)
    proximal = logps + 0.3 * torch.randn(logps.shape, generator=g)
    behaviour = proximal + 1.2 * torch.randn(logps.shape, generator=g)  # several versions old: weights from ~0.05 to ~20
    batch = batch_of(adv, mask, behaviour)
    opts = options("dapo", sampling_correction_mode="token_mask", sampling_correction_clip_max=3.0)
    ours, grad = loss_and_grad(logps, batch, opts, normalizer=float(mask.sum()), old_logps=proximal)
    leaf = logps.clone().requires_grad_(True)
    theirs = areal_decoupled_loss(leaf, proximal, behaviour, adv, mask, 0.2, 0.28, 3.0)
    theirs.backward()
    assert float(ours.loss) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-5, atol=1e-7)
    assert ours.sampling_truncated == float(((torch.exp(proximal - behaviour) > 3.0) & mask.bool()).sum()) > 0


# ------------------------------------------------------------------ the update's paths, on a model


VOCAB = 48


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256, attn_implementation="sdpa")
    return LlamaForCausalLM(config).float().eval()


def two_adapters(model):
    from agentgym_lightning.training.agent_adapters import AgentAdapters, add_agent_adapters

    lora = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear")
    model = add_agent_adapters(model, lora, ["w1", "r1"])
    with torch.no_grad():  # adapters that differ from each other and from the base model
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    return model, AgentAdapters({"writer": "w1", "checker": "r1"})


# Behaviour minus current logprob per completion token, cycled: weights e^0, e^0.5, e^1.5 (> 3:
# truncated), e^-0.7.
OFFSETS = [0.0, 0.5, 1.5, -0.7]


def stale_rows(model, adapters):
    """Rows sharing prefixes (a group's calls), each token's behaviour logprob off its current
    one by OFFSETS; returns the rows and the behaviour weights' expected sum and truncated count."""
    from agentgym_lightning.training.agent_adapters import activate

    shapes = [([1, 2, 3, 4], [5, 6, 7]), ([1, 2, 3, 4], [5, 8, 9, 10]), ([1, 2, 3, 4, 5, 6, 7, 11], [12, 13]), ([1, 2, 9], [14, 15, 16, 17, 18])]
    rows, total, truncated = [], 0.0, 0.0
    for i, (prompt, completion) in enumerate(shapes):
        adapter = ("w1", "r1")[i % 2] if adapters is not None else None
        n = len(completion)
        mask = [1] * n if i != 3 else [1, 1, 0, 1, 1]  # an env token inside a trajectory row
        if adapter is not None:
            activate(model, adapter, adapters.names)
        probe = pad_samples([Sample(prompt, completion, [1] * n, [0.0] * n, [0.0] * n, 1.0, "p", None)], 0)
        with torch.no_grad():
            current = per_token_logps(model, probe, 1.0, compute_entropy=False)[0][0].tolist()
        offsets = [OFFSETS[(i + j) % len(OFFSETS)] for j in range(n)]
        sampling = [c - o if m else NAN for c, o, m in zip(current, offsets, mask)]
        advantages = [(1.0 if i % 2 else -0.5) * m for m in mask]
        rows.append(Sample(prompt, completion, mask, sampling, advantages, 1.0, f"e{i}", "g", adapter=adapter))
        for o, m in zip(offsets, mask):
            if m:
                total += min(math.exp(o), 3.0)
                truncated += float(math.exp(o) > 3.0)
    return rows, total, truncated


@pytest.mark.parametrize("num_iterations", [1, 2])
@pytest.mark.parametrize("path", ["tree", "padded", "lora_per_agent"])
def test_the_proximal_policy_is_the_weights_the_update_starts_from(path, num_iterations):
    """On each path of the update, the behaviour weight is taken against the logprobs of the
    weights the update starts from (the row's own adapter active): its sum and truncated count
    are the hand-computed ones. With ``num_iterations = 2`` the proximal logprobs are fixed
    before the first optimizer step: after the weights move, the behaviour weights stay the same
    and the ratio ``π_θ / π_prox`` moves off 1."""
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.update import MicroBatches

    model, adapters = tiny_llama(), None
    if path == "lora_per_agent":
        model, adapters = two_adapters(model)
    rows, expected_sum, expected_truncated = stale_rows(model, adapters)
    config = LightningRLConfig(report_to=[], num_iterations=num_iterations, temperature=1.0, micro_batch_tokens=12,
                               per_device_train_batch_size=2, sampling_correction_clip_max=3.0)
    micro = MicroBatches(rows, config, packed=path != "padded", pad_token_id=0, device="cpu", adapters=adapters)
    assert len(micro) > 1  # the rows are cut into several micro-batches
    fixed = micro.fixed_logps(model, None)
    assert (fixed.old is not None) == (num_iterations > 1)

    def totals():
        sums = {"tokens": 0.0, "sampling_ratio_sum": 0.0, "sampling_truncated": 0.0, "ratio_sum": 0.0}
        for i in range(len(micro)):
            terms = micro.loss(model, i, fixed)
            for name in sums:
                sums[name] += getattr(terms, name)
        return sums

    first = totals()
    assert first["tokens"] == sum(s.num_loss_tokens for s in rows)
    assert first["sampling_ratio_sum"] == pytest.approx(expected_sum, rel=1e-4)
    assert first["sampling_truncated"] == expected_truncated > 0
    assert first["ratio_sum"] == pytest.approx(first["tokens"], rel=1e-5)  # u = 1 before any step
    if num_iterations == 1:
        return
    with torch.no_grad():  # the first optimizer step moved the trained weights
        for name, param in model.named_parameters():
            if adapters is None or "lora_" in name:
                param.add_(0.05 * torch.randn_like(param))
    second = totals()
    assert second["sampling_ratio_sum"] == pytest.approx(expected_sum, rel=1e-4)  # still against π_prox
    assert second["sampling_truncated"] == expected_truncated
    assert abs(second["ratio_sum"] - second["tokens"]) > 1e-3  # u moved off 1


def test_the_update_logs_the_behaviour_weights_mean_and_truncated_share():
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.update import MicroBatches, UpdateStats

    model = tiny_llama()
    rows, expected_sum, expected_truncated = stale_rows(model, None)
    config = LightningRLConfig(report_to=[], temperature=1.0, sampling_correction_clip_max=3.0)
    micro = MicroBatches(rows, config, packed=True, pad_token_id=0, device="cpu")
    fixed = micro.fixed_logps(model, None)
    stats = UpdateStats()
    for i in range(len(micro)):
        stats.add(micro.loss(model, i, fixed), micro.owners[i])
    metrics = stats.metrics(micro, learning_rate=1e-3)
    tokens = sum(s.num_loss_tokens for s in rows)
    assert metrics["sampling_ratio/mean"] == pytest.approx(expected_sum / tokens, rel=1e-4)
    assert metrics["sampling_ratio/truncated"] == pytest.approx(expected_truncated / tokens)
