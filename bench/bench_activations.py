"""Activation memory of one micro-batch's forward and backward, per token, by how the update runs it.

Each case runs in its own process on the embedded SmolLM2-135M (fp32, CPU, sdpa): one row of
``T`` tokens (``--completion`` of them in the loss) through the update's own code
(:class:`~agentgym_lightning.training.update.MicroBatches` and its loss), one forward and backward,
the gradients allocated beforehand (as from a step's second micro-batch on). Three measures:
**kept**, the bytes of the tensors autograd keeps for the backward (each storage once, the weights
left out: ``saved_tensors_hooks``); **live peak**, the peak bytes of live tensors between the
forward's start and the backward's end (PyTorch's profiler records every allocation and free),
both exact and the same on every run; and **RSS peak**, the process's peak RSS minus its RSS before
the forward, in a second process without the profiler (whose records would count): what the
machine sees, but it moves by up to a GiB between runs of one case (the allocator's free lists).
The memory plan's estimate (:func:`~agentgym_lightning.training.memory_plan.activation_bytes`) is
printed as a ratio to the live peak. Cases:

* ``padded``: the padded update (``packed_update=False``);
* ``tree``: the token-tree update (one row: the tree is the row; the 4D mask is what differs);
* ``tree-bool-mask``: the same with a boolean 4D mask, as the tree was run before
  (sdpa converts it to float in every layer and keeps each copy for the backward);
* ``padded-gc``: the padded update with gradient checkpointing.

It prints them in MiB per case and size, kept's ratio to ``tree``, and the plan's estimate over
the live peak.

    python bench/bench_activations.py                  # 2,048 and 4,096 tokens
    python bench/bench_activations.py --tokens 1024 --cases tree tree-bool-mask
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = ("padded", "tree", "tree-bool-mask", "padded-gc")

_PROBE = r"""
import contextlib, json, sys
import torch
from torch.profiler import ProfilerActivity, profile
tokens, completion, case, profiled = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "live"
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
from agentgym_lightning.policies.models import resolve_model
from agentgym_lightning.training import LightningRLConfig
from agentgym_lightning.training.samples import Sample
from agentgym_lightning.training.token_tree import TokenTree
from agentgym_lightning.training.update import FixedLogps, MicroBatches

if case == "tree-bool-mask":
    additive = TokenTree.attention_mask
    TokenTree.attention_mask = lambda self, dtype: additive(self, dtype) == 0
model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m", progress=False), dtype=torch.float32, attn_implementation="sdpa")
gc = case == "padded-gc"
if gc:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.train()
with torch.no_grad():
    for p in model.parameters():
        p.data = p.data.clone()  # resident, not a mapped file paged in during the forward
config = LightningRLConfig(env="lightning/GuessNumber-v0", micro_batch_tokens=None, report_to=[], progress=False, gradient_checkpointing=gc)
ids = torch.randint(100, 40000, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
row = Sample(prompt_ids=ids[:-completion], completion_ids=ids[-completion:], loss_mask=[1] * completion, sampling_logprobs=[-1.0] * completion,
             advantages=[1.0] * completion, weight=1.0, episode_id="e", group_id="g")
micro = MicroBatches([row], config, packed=case.startswith("tree"), pad_token_id=0, device="cpu")

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

for p in model.parameters():
    p.grad = torch.zeros_like(p)
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here
saved = {}

def pack(tensor):
    storage = tensor.untyped_storage()
    saved[storage.data_ptr()] = storage.nbytes()  # a view of a kept tensor costs nothing more
    return tensor

with profile(activities=[ProfilerActivity.CPU], profile_memory=True) if profiled else contextlib.nullcontext() as profiler:
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        terms = micro.loss(model, 0, FixedLogps())
    terms.loss.backward()
rss = status("VmHWM:") - before
params = {p.untyped_storage().data_ptr() for p in model.parameters()}
kept = sum(size for ptr, size in saved.items() if ptr not in params)
live = peak = 0
events = profiler.profiler.kineto_results.events() if profiled else []
for event in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
    live += event.nbytes()  # an allocation's bytes, a free's negated
    peak = max(peak, live)
print(json.dumps({"activations": rss, "kept": kept, "peak": peak, "loss": float(terms.loss)}))
"""


def measure(tokens: int, completion: int, case: str) -> dict[str, float]:
    """One case: its live peak (under the profiler) and its RSS peak (without), each in its own process."""
    def probe(mode: str) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-c", _PROBE, str(tokens), str(completion), case, mode], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    return {**probe("live"), "activations": probe("rss")["activations"]}


def estimate(tokens: int, completion: int, case: str) -> int:
    """The memory plan's activation estimate for ``case`` (the tree's logits go through TRL's chunked kernel)."""
    from transformers import AutoConfig

    from agentgym_lightning.policies.models import resolve_model
    from agentgym_lightning.training.memory_plan import activation_bytes

    tree = case.startswith("tree")
    config = AutoConfig.from_pretrained(resolve_model("smollm2-135m", progress=False))
    return activation_bytes(config, tokens=tokens, itemsize=4, tree=tree, gradient_checkpointing=case == "padded-gc",
                            logit_positions=completion + 1, tiled_logits=tree, trained_head=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--completion", type=int, default=64, help="tokens of the row in the loss")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = parser.parse_args()
    mib = 2**20
    print(f"{'tokens':>6}  {'case':<15} {'kept MiB':>8} {'/ tree':>7} {'live peak':>9} {'RSS peak':>8} {'plan/live':>9}  loss")
    for tokens in args.tokens:
        results = {case: measure(tokens, args.completion, case) for case in args.cases}
        for case, result in results.items():
            ratio = f"{result['kept'] / results['tree']['kept']:.2f}x" if "tree" in results else "-"
            print(f"{tokens:>6}  {case:<15} {result['kept'] / mib:>8.0f} {ratio:>7} {result['peak'] / mib:>9.0f} "
                  f"{result['activations'] / mib:>8.0f} {estimate(tokens, args.completion, case) / result['peak']:>8.2f}x  {result['loss']:.6g}")


if __name__ == "__main__":
    main()
