"""Trainer step time: ours against TRL's own GRPOTrainer, and the split of one of our steps.

Two measurements, both on the embedded SmolLM2-135M, fp32, CPU unless CUDA is there:

``--part trl`` (default) — the same single-turn task through TRL's ``GRPOTrainer`` (transformers
generation) and through ``LightningRLTrainer`` (an unmodified agent behind the gateway, the hf
backend): same model, B prompts x G completions per step, completion length, temperature, loss
(``dapo``), learning rate, one optimizer step per generation. The two run *interleaved* in one
process — a TRL step, then one of ours, and so on (ours is driven from a TRL callback) — so the
machine's load hits both alike; the first round is warm-up. Prints each side's median step time
and their ratio (ours / TRL; the goal is <= 1.1).

``--part steps`` — N steps of ours on an env, with the seconds of rollout, update and sync and the
generation tokens/s; ``--backend vllm`` runs it with the in-process vLLM engine (from .venv-vllm).

    python bench/bench_trainer.py --rounds 6
    python bench/bench_trainer.py --part steps --env lightning/Arithmetic-v0 --steps 4
    .venv-vllm/bin/python bench/bench_trainer.py --part steps --backend vllm --env lightning/Arithmetic-v0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

QUESTIONS = [f"What is {a} plus {b}? Answer with the number." for a, b in [(12, 30), (7, 8), (25, 17), (40, 2), (9, 9), (31, 11)]]


def _answer(question: str) -> str:
    words = question.split()
    return str(int(words[2]) + int(words[4].rstrip("?")))


def _reward_text(question: str, text: str) -> float:
    return 1.0 if _answer(question) in (text or "") else 0.0


def single_turn_agent(task: dict[str, Any], ctx: Any) -> str:
    reply = ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task["question"]}])
    return reply.choices[0].message.content or ""


def _ours(model_path: str, args: argparse.Namespace, output_dir: str) -> Any:
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def make_env() -> AgentEnv:
        return AgentEnv(single_turn_agent, [{"question": q} for q in QUESTIONS], lambda task, result: _reward_text(task["question"], result))

    config = LightningRLConfig(
        env="bench/single-turn", model=model_path, max_steps=10**6, tasks_per_step=args.prompts, num_generations=args.group,
        max_completion_length=args.tokens, temperature=1.0, loss_type="dapo", learning_rate=1e-6,
        per_device_train_batch_size=args.prompts * args.group, output_dir=output_dir, report_to=[], progress=False,
        save_steps=10**6, log_episodes=0, zero_variance_groups="keep",  # TRL trains every group too
    )
    policy = HFPolicy(model_path, device=args.device, max_batch_size=64)
    return LightningRLTrainer(config, env=make_env, policy=policy)


def part_trl(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym_lightning.policies.models import resolve_model

    model_path = str(resolve_model("smollm2-135m"))
    work = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    ours = _ours(model_path, args, str(work / "ours"))
    trl_times: list[float] = []
    our_times: list[float] = []
    our_split: list[dict[str, float]] = []

    class Interleave(TrainerCallback):
        def on_step_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            trl_times.append(time.perf_counter() - self.start)
            start = time.perf_counter()
            metrics = ours.train_step()
            our_times.append(time.perf_counter() - start)
            our_split.append(metrics)
            print(f"round {len(trl_times)}: TRL {trl_times[-1]:.1f} s, ours {our_times[-1]:.1f} s "
                  f"(rollout {metrics['time/rollout_s']:.1f}, update {metrics['time/update_s']:.1f})", flush=True)

    def reward(prompts: Any, completions: Any, **kw: Any) -> list[float]:
        return [_reward_text(p[-1]["content"], c[-1]["content"]) for p, c in zip(prompts, completions)]

    config = GRPOConfig(
        output_dir=str(work / "trl"), use_cpu=args.device == "cpu", bf16=False, per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1, num_generations=args.group, max_completion_length=args.tokens, temperature=1.0,
        top_p=1.0, loss_type="dapo", learning_rate=1e-6, max_steps=args.rounds, logging_steps=10**6, save_strategy="no",
        report_to=[], gradient_checkpointing=False, beta=0.0, seed=0, lr_scheduler_type="constant",
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in QUESTIONS] * 50})
    trainer = GRPOTrainer(
        model=model_path, reward_funcs=reward, args=config, train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_path), callbacks=[Interleave()],
    )
    print(f"torch threads {torch.get_num_threads()}; {args.prompts} prompts x {args.group} completions, {args.tokens} tokens, "
          f"{args.rounds} interleaved rounds (the first is warm-up)", flush=True)
    trainer.train()
    t, o = trl_times[1:], our_times[1:]
    if not t:
        print("need at least 2 rounds")
        return
    mt, mo = statistics.median(t), statistics.median(o)
    print(f"\nmedian step: TRL GRPOTrainer {mt:.1f} s, LightningRLTrainer {mo:.1f} s  ->  ours / TRL = {mo / mt:.2f}")
    split = our_split[1:]
    print("ours, median split: " + ", ".join(f"{k.split('/')[1]} {statistics.median(s[k] for s in split):.1f} s"
                                               for k in ("time/rollout_s", "time/update_s", "time/sync_s")))


def part_steps(args: argparse.Namespace) -> None:
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    work = tempfile.mkdtemp(prefix="bench-steps-")
    config = LightningRLConfig(
        env=args.env, backend=args.backend, max_steps=args.steps, tasks_per_step=args.prompts, num_generations=args.group,
        max_completion_length=args.tokens, output_dir=work, report_to=[], progress=False, save_steps=10**6, log_episodes=0,
        zero_variance_groups="keep",
    )
    trainer = LightningRLTrainer(config)
    rows = []
    for _ in range(args.steps):
        m = trainer.train_step()
        tokens = m.get("train/completion_tokens", float("nan"))
        rows.append(m)
        print(f"step {int(m['epoch'] * 0) + len(rows)}: rollout {m['time/rollout_s']:.1f} s, update {m['time/update_s']:.1f} s, "
              f"sync {m['time/sync_s']:.2f} s, {tokens:.0f} tokens at {m['train/tokens_per_s']:.1f} tokens/s", flush=True)
    keep = rows[1:] or rows
    med = {k: float(np.median([r[k] for r in keep])) for k in ("time/rollout_s", "time/update_s", "time/sync_s", "time/step_s", "train/tokens_per_s")}
    print(f"\n{args.backend} backend, median of steps 2..{args.steps}: step {med['time/step_s']:.1f} s = rollout {med['time/rollout_s']:.1f} "
          f"+ update {med['time/update_s']:.1f} + sync {med['time/sync_s']:.2f}; generation {med['train/tokens_per_s']:.1f} tokens/s")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--part", choices=["trl", "steps"], default="trl")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds for --part trl (first is warm-up)")
    p.add_argument("--steps", type=int, default=4, help="steps for --part steps")
    p.add_argument("--env", default="lightning/Arithmetic-v0")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--prompts", type=int, default=2, help="B: prompts (tasks) per step")
    p.add_argument("--group", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--tokens", type=int, default=32, help="completion length")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    (part_trl if args.part == "trl" else part_steps)(args)


if __name__ == "__main__":
    sys.exit(main())
