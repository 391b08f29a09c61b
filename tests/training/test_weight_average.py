"""Checkpoint averaging (``agentgym-lightning average``): the mean of checkpoints' weights as a model folder."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


def _checkpoint(tiny_model_dir, run, step, shift):
    """Checkpoint ``step`` of ``run``: the tiny model with every weight moved by ``shift``, saved as the trainer saves it."""
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training.checkpoint import TrainerState, save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = TrainerState(step=step, config={"model": str(tiny_model_dir)}, history=[], extra={})
    save_checkpoint(run, model=model, peft=False, optimizer=optimizer, scheduler=scheduler, state=state, keep=None)
    return run / "checkpoints" / f"checkpoint-{step:06d}"


def _state(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def test_the_mean_of_two_checkpoints_and_a_weighted_mean_are_model_folders_with_the_base_models_tokenizer(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    from agentgym_lightning.cli import main

    run = tmp_path / "run"
    first, second = _checkpoint(tiny_model_dir, run, 10, 0.01), _checkpoint(tiny_model_dir, run, 20, 0.03)
    base = _state(tiny_model_dir)

    assert main(["average", str(first), str(second), "--output", str(tmp_path / "mean"), "--no-progress"]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    mean = _state(tmp_path / "mean")
    assert set(mean) == set(base)
    for name, tensor in base.items():  # every weight, the tied head too, halfway: +0.02
        assert torch.allclose(mean[name], tensor + 0.02, atol=1e-6), name
    text = "12 + 30 = 42"
    assert AutoTokenizer.from_pretrained(tmp_path / "mean").encode(text) == AutoTokenizer.from_pretrained(tiny_model_dir).encode(text)
    record = json.loads((tmp_path / "mean" / "averaged_from.json").read_text())
    assert record == {"sources": [str(first.resolve()), str(second.resolve())], "weights": [0.5, 0.5]}

    # Weighted 1:3, and the run folder itself as a source (its newest checkpoint: step 20) beside the first checkpoint.
    assert main(["average", str(first), str(run), "--weights", "1", "3", "--output", str(tmp_path / "weighted"), "--no-progress"]) == 0
    weighted = _state(tmp_path / "weighted")
    for name, tensor in base.items():
        assert torch.allclose(weighted[name], tensor + 0.025, atol=1e-6), name
    assert json.loads((tmp_path / "weighted" / "averaged_from.json").read_text())["weights"] == [0.25, 0.75]
    # An averaged folder is a model folder: it averages again, and its record is its own.
    assert main(["average", str(tmp_path / "mean"), str(second), "--output", str(tmp_path / "again"), "--no-progress"]) == 0
    for name, tensor in _state(tmp_path / "again").items():
        assert torch.allclose(tensor, base[name] + 0.025, atol=1e-6), name
    assert json.loads((tmp_path / "again" / "averaged_from.json").read_text())["sources"][0] == str((tmp_path / "mean").resolve())


def test_bad_sources_are_refused_in_one_line_and_nothing_is_written(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentgym_lightning.cli import main

    run = tmp_path / "run"
    first, second = _checkpoint(tiny_model_dir, run, 1, 0.01), _checkpoint(tiny_model_dir, run, 2, 0.02)
    wider = tmp_path / "wider"
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.update({"intermediate_size": 256})
    AutoModelForCausalLM.from_config(config).save_pretrained(wider)
    lora = tmp_path / "lora" / "checkpoints" / "checkpoint-000001"
    lora.mkdir(parents=True)
    (lora / "adapter.safetensors").write_bytes(b"")
    (lora / "trainer_state.json").write_text(json.dumps({"step": 1, "config": {"model": str(tiny_model_dir)}}))
    (tmp_path / "taken").mkdir()
    capsys.readouterr()  # the setup's loading bars

    cases = [
        ([str(first)], "at least two"),
        ([str(first), str(tmp_path / "nowhere")], "no such run"),
        ([str(first), str(wider)], "shape"),
        ([str(first), str(lora.parent.parent)], "LoRA adapter weights"),
        ([str(first), str(second), "--weights", "1"], "1 weights for 2 sources"),
        ([str(first), str(second), "--weights", "1", "-1"], "non-negative"),
        ([str(first), str(second), "--weights", "0", "0"], "positive sum"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, message in cases:
        assert main(["average", *args, "--output", str(tmp_path / "out"), "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["average", str(first), str(second), "--output", str(tmp_path / "taken"), "--no-progress"]) == 2
    assert "exists" in capsys.readouterr().err

    # A checkpoint whose weights changed since they were saved fails its manifest and is not averaged.
    weights = second / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    assert main(["average", str(first), str(second), "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output folder, no leftover temporary one
