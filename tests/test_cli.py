"""The ``agentgym-lightning`` command's process-wide settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _probe(code: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True).stdout.split()


def test_the_command_makes_idle_openmp_threads_sleep_unless_told_otherwise():
    """OMP_WAIT_POLICY=PASSIVE is set before torch loads OpenMP (by the package's import, which the
    command's module runs first); a policy the user set is kept, and once torch is loaded nothing
    is changed (OpenMP has read it already)."""
    probe = "import os; from agentgym_lightning.cli import main; print(os.environ.get('OMP_WAIT_POLICY'))"
    assert _probe(probe) == ["PASSIVE"]
    assert _probe(probe, OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE"]
    assert _probe("import torch; " + probe) == ["None"]


def test_the_help_screen_imports_no_command():
    """``agentgym-lightning --help`` lists every command without importing what they run (it
    took 2.7 CPU-s importing openai, the gateway and the Agents SDK)."""
    code = (
        "import sys\nfrom agentgym_lightning.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('openai', 'agents', 'torch', 'agentgym_lightning.gateway', 'agentgym_lightning.training.config', "
        "'agentgym_lightning.envs.rag.cli')\n"
        "print('loaded:', *[m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "train" in out and "view" in out and "data" in out  # every command is listed
    assert out.strip().splitlines()[-1] == "loaded:"


def test_train_help_shows_each_options_default(capsys):
    import pytest

    from agentgym_lightning.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Training steps (each: rollouts, one update, a weight sync). (default: 20)" in out
    assert "(default: lightning/Arithmetic-v0)" in out and "--overwrite" in out


def test_a_misspelt_env_kwarg_is_one_line_before_the_model_loads(tmp_path, capsys):
    from agentgym_lightning.cli import main

    # Before: a 38-line traceback from the trainer's probe env.
    assert main(["train", "--env", "lightning/GuessNumber-v0", "--env-kwarg", "dificulty=3", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--env-kwarg: lightning/GuessNumber-v0 does not accept {'dificulty': 3}" in err
    assert main(["train", "--env", "lightning/GuessNumber-v0", "--eval-env-kwarg", "splt=3", "--output-dir", str(tmp_path)]) == 2
    assert "--eval-env-kwarg: lightning/GuessNumber-v0 does not accept" in capsys.readouterr().err


def test_a_refused_training_env_names_the_kwargs_it_was_built_with_air_weights_among_them(tmp_path, capsys):
    """Before: the probes named ``env_kwargs`` alone, while the env was built with the run's AIR
    weights merged into them (what the env's creator itself was given)."""
    from agentgym_lightning.cli import main
    from agentgym_lightning.training.env_factories import training_env_factory

    factory = training_env_factory("lightning/GuessNumber-v0", {"dificulty": 3}, {"guess.x": 0.1})
    assert factory.kwargs == {"dificulty": 3, "air_weights": {"guess.x": 0.1}}
    said = "lightning/GuessNumber-v0 does not accept {'dificulty': 3, 'air_weights': {'guess.x': 0.1}}"
    common = ["--env", "lightning/GuessNumber-v0", "--env-kwarg", "dificulty=3", "--air", "guess.x=0.1"]
    assert main(["train", *common, "--output-dir", str(tmp_path / "rl")]) == 2  # the trainer's probe
    assert f"--env-kwarg: {said}:" in capsys.readouterr().err
    source = tmp_path / "e.jsonl"
    source.write_text("")
    assert main(["sft", str(source), "--rounds", "1", *common, "--output-dir", str(tmp_path / "sft")]) == 2  # the command's check
    assert f"--env-kwarg: {said}:" in capsys.readouterr().err


COUNTED_ENV = """
import json
from pathlib import Path

from agentgym_lightning.envs.guess_number import make_env as guess_number


def make_env(**kwargs):
    with open(Path(__file__).with_name("built.jsonl"), "a") as fh:
        fh.write(json.dumps(kwargs) + "\\n")
    return guess_number(**kwargs)
"""


def test_train_builds_the_training_env_once_and_the_held_out_one_once_before_training(tmp_path, tiny_model_dir, monkeypatch):
    """Before: the command built the training env to check its kwargs, then the trainer built it
    again for its tasks (the RAG env loads its corpus and retriever each time): three builds
    before the first step, now two (the trainer's, which is the check, and the held-out env's)."""
    import json

    import pytest

    from agentgym_lightning.cli import main
    from agentgym_lightning.training import trainer

    pytest.importorskip("trl")
    (tmp_path / "counted_env.py").write_text(COUNTED_ENV)

    def stop(self, resume_from=None):
        self.close()
        raise ValueError("stopped before the first step")

    monkeypatch.setattr(trainer.LightningRLTrainer, "train", stop)
    code = main(["train", "--env", f"{tmp_path / 'counted_env.py'}:make_env", "--env-kwarg", "max_guesses=2", "--eval-env-kwarg",
                 "max_guesses=3", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "run"), "--no-progress", "--no-wandb"])
    assert code == 2
    built = [json.loads(line) for line in (tmp_path / "built.jsonl").read_text().splitlines()]
    assert sorted(b["max_guesses"] for b in built) == [2, 3]


def _a_run(folder):
    (folder / "checkpoints" / "checkpoint-000001").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-000001" / "trainer_state.json").write_text('{"step": 1, "config": {}}')
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    (folder / "trajectories").mkdir()
    (folder / "notes.txt").write_text("mine")
    return folder


def test_an_output_dir_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path, capsys):
    from agentgym_lightning.cli import main

    run = _a_run(tmp_path / "run")
    # Before: the new run overwrote metrics.jsonl and left the old trajectories and checkpoint beside its own.
    assert main(["train", "--env", "lightning/GuessNumber-v0", "--output-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"--output-dir {run} already holds a run (metrics.jsonl, checkpoints, trajectories)" in err
    assert f"--resume {run}" in err and "--overwrite" in err
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err
    other = _a_run(tmp_path / "other")  # resuming one run into another run's folder
    assert main(["train", "--resume", str(run), "--output-dir", str(other), "--env", "lightning/GuessNumber-v0"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_overwrite_deletes_the_run_files_and_nothing_else(tmp_path):
    from agentgym_lightning.commands.train import check_output_dir

    run = _a_run(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("x")
    (run / "final").symlink_to(elsewhere)  # a link is removed, never followed
    check_output_dir(run, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert (elsewhere / "keep.txt").read_text() == "x"
    check_output_dir(_a_run(tmp_path / "again"), resume=tmp_path / "again" / "checkpoints" / "checkpoint-000001")  # its own run: fine


def test_train_refuses_a_binary_judge_rubric_naming_the_file(tmp_path, capsys):
    from agentgym_lightning.cli import main

    binary = tmp_path / "rubric.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    status = main(["train", "--judge-base-url", "http://127.0.0.1:1/v1", "--judge-rubric", f"@{binary}", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    # Before: "'utf-8' codec can't decode byte 0x89 in position 0: invalid start byte", and no file named.
    assert status == 2 and f"--judge-rubric @{binary}: not UTF-8 text (byte 0x89 at offset 0): give a text file" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "sft"])
def test_resuming_a_finished_run_says_there_is_nothing_to_do_without_loading_a_model(command, tmp_path, capsys, monkeypatch):
    from agentgym_lightning.cli import main
    from agentgym_lightning.commands import train as train_command

    if command == "train":
        from agentgym_lightning.training import LightningRLConfig as Config

        config = Config(env="lightning/GuessNumber-v0", max_steps=2, output_dir=str(tmp_path / "run"))
    else:
        from agentgym_lightning.training.sft import SFTConfig as Config

        config = Config(sources=[str(tmp_path)], max_steps=2, output_dir=str(tmp_path / "run"))
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 2, "config": config.to_dict(), "history": []}))
    (tmp_path / "run" / "final").mkdir()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded to do nothing")

    monkeypatch.setattr(train_command, "run_trainer", no_model)
    status = main([command, "--resume", str(tmp_path / "run")])
    out = capsys.readouterr().out
    # Before: the model loaded (75 s for the embedded one) and the old summary printed again, saying nothing.
    assert status == 0
    assert f"nothing to do: the run in {tmp_path / 'run'} is finished (checkpoint-000002 is step 2 of max_steps 2" in out
    # The command it suggests parses (it said --max-steps, which is no flag) and trains to step 4.
    suggested = out.split("(--resume ")[1].split(")")[0].split()
    assert suggested == [str(tmp_path / "run"), "--steps", "4"]
    ran = {}

    def record(command, config, *args, **kwargs):
        ran["max_steps"] = config.max_steps
        return 0

    monkeypatch.setattr(train_command, "run_trainer", record)
    main([command, "--resume", *suggested])
    assert ran == {"max_steps": 4}
