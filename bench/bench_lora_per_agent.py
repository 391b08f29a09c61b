"""What an adapter per agent costs (``lora_per_agent``), measured in one run on SmolLM2-135M:

* generation: one batch of B calls (sampled, seeded, the same prompts) routed to 1, 2 or 4 LoRA
  adapters (rows dealt round-robin) — tokens/s, against the batch on one adapter (the plain
  ``use_peft`` path: no routing);
* the update: the same rows trained as one adapter's or split over 2 and 4 adapters (micro-batches
  never mix adapters) — seconds.

Rounds are interleaved (each round runs every variant once) and medians reported, with ratios to
the one-adapter baseline::

    python bench/bench_lora_per_agent.py --rounds 3 --batch 8 --tokens 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from agentgym_lightning.llm import ChatRequest, SamplingParams
from agentgym_lightning.policies.hf import HFPolicy
from agentgym_lightning.training.agent_adapters import AdapterRouting, AgentAdapters, add_agent_adapters


def _requests(batch: int, tokens: int) -> list[ChatRequest]:
    return [
        ChatRequest(
            messages=[{"role": "user", "content": f"Question {i}: how many {w} are there in a dozen? Explain."}],
            sampling=SamplingParams(temperature=1.0, seed=i, max_tokens=tokens),
            metadata={"agent": f"agent{i}"},
        )
        for i, w in zip(range(batch), ["eggs", "apples", "cats", "books", "cups", "pens", "hats", "keys"] * batch)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    policy = HFPolicy("smollm2-135m", device="cpu", num_threads=args.threads, default_max_tokens=args.tokens)
    names = ["a0", "a1", "a2", "a3"]
    lora = SimpleNamespace(lora_r=16, lora_alpha=32, lora_dropout=0.0, lora_target_modules="all-linear")
    model = add_agent_adapters(policy.hf_model, lora, names)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.01)  # trained-looking adapters (B = 0 is the base model)
    policy.hf_model = model
    requests = _requests(args.batch, args.tokens)

    def routing(k: int) -> AdapterRouting:
        return AdapterRouting(policy, AgentAdapters({f"agent{i}": names[i % k] for i in range(args.batch)}))

    variants = {f"{k} adapter(s)": routing(k) for k in (1, 2, 4)}
    variants = {"one adapter, no routing": policy, **variants}
    gen: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, generator in variants.items():
            start = time.perf_counter()
            out = generator.generate(requests)
            gen[name].append(sum(len(c.completion_token_ids or []) for c in out) / (time.perf_counter() - start))
    base = statistics.median(gen["one adapter, no routing"])
    print(f"generation, batch {args.batch} x {args.tokens} tokens, {args.threads} threads, median of {args.rounds}:")
    for name, values in gen.items():
        print(f"  {name:>24}: {statistics.median(values):7.1f} tokens/s  ({statistics.median(values) / base:.2f}x)")

    # The update: the rows of the 4-adapter batch, trained as 1, 2 or 4 adapters' rows.
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.samples import Sample, SampleBatch
    from agentgym_lightning.training.trainer import LightningRLTrainer

    out = routing(4).generate(requests)
    rows = [
        Sample(list(c.prompt_token_ids), list(c.completion_token_ids), [1] * len(c.completion_token_ids), list(c.logprobs),
               [1.0 if i % 2 else -1.0] * len(c.completion_token_ids), 1.0, f"e{i}", "g", [0])
        for i, c in enumerate(out)
    ]
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    trainers = {}
    for k in times:
        config = LightningRLConfig(env="lightning/GuessNumber-v0", lora_per_agent={f"agent{i}": names[i % k] for i in range(args.batch)},
                                   report_to=[], progress=False, output_dir="/tmp/bench-lora-per-agent", num_threads=args.threads)
        fresh = HFPolicy("smollm2-135m", device="cpu", num_threads=args.threads)
        trainers[k] = LightningRLTrainer(config, policy=fresh)
    for _ in range(args.rounds):
        for k, trainer in trainers.items():
            batch = SampleBatch(samples=[Sample(**{**r.__dict__, "adapter": names[i % k]}) for i, r in enumerate(rows)])
            start = time.perf_counter()
            trainer.update(batch)
            times[k].append(time.perf_counter() - start)
    print(f"update, {len(rows)} rows ({sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)} tokens), median of {args.rounds}:")
    for k, values in times.items():
        print(f"  {k} adapter(s): {statistics.median(values):6.2f} s  ({statistics.median(values) / statistics.median(times[1]):.2f}x)")


if __name__ == "__main__":
    main()
