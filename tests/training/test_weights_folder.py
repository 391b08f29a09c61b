"""A run's weights as a model folder: ``eval --model RUN`` evaluates a checkpoint from the middle of a run."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")


def _run_with_checkpoint(tiny_model_dir, root, step=3):
    """A run folder whose checkpoint ``step`` holds the tiny model with every weight shifted by 0.01
    (as the trainer writes it: the manifest, the run's saved config naming its base model)."""
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training.checkpoint import TrainerState, save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = TrainerState(step=step, config={"model": str(tiny_model_dir)}, history=[], extra={})
    save_checkpoint(root, model=model, peft=False, optimizer=optimizer, scheduler=scheduler, state=state)
    return model


def test_a_checkpoint_becomes_a_model_folder_with_its_weights_and_its_base_models_tokenizer(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_lightning.training.weights_folder import holds_run_weights, weights_model_folder

    run = tmp_path / "run"
    trained = _run_with_checkpoint(tiny_model_dir, run)
    checkpoint = run / "checkpoints" / "checkpoint-000003"
    assert holds_run_weights(run) and holds_run_weights(checkpoint)
    assert not holds_run_weights(tiny_model_dir) and not holds_run_weights(tmp_path)
    files = sorted(p.relative_to(run) for p in run.rglob("*"))
    for given in (run, checkpoint):
        with weights_model_folder(given) as folder:
            loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
            assert AutoTokenizer.from_pretrained(folder).encode("12 + 30") == AutoTokenizer.from_pretrained(tiny_model_dir).encode("12 + 30")
            # The checkpoint's weights, not the base model's (every one of them moved by 0.01), the tied head too.
            for name, tensor in trained.state_dict().items():
                assert torch.equal(loaded.state_dict()[name], tensor), name
            assert (folder / "model.safetensors").resolve() == (checkpoint / "model.safetensors").resolve()
        assert not folder.exists()  # a temporary folder of links, gone after use
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == files  # nothing written into the run


def test_a_run_with_a_final_model_gives_that_folder_and_lora_weights_are_refused(tiny_model_dir, tmp_path):
    import shutil

    from agentgym_lightning.training.weights_folder import weights_model_folder

    run = tmp_path / "run"
    _run_with_checkpoint(tiny_model_dir, run)
    shutil.copytree(tiny_model_dir, run / "final")
    with weights_model_folder(run) as folder:
        assert folder == run / "final"

    lora = tmp_path / "lora" / "checkpoints" / "checkpoint-000001"
    lora.mkdir(parents=True)
    (lora / "adapter.safetensors").write_bytes(b"")
    (lora / "trainer_state.json").write_text(json.dumps({"step": 1, "config": {"model": str(tiny_model_dir)}}))
    with pytest.raises(ValueError, match="holds LoRA adapter weights, not a whole model"):
        with weights_model_folder(tmp_path / "lora"):
            pass


def test_eval_of_a_checkpoint_runs_the_checkpoints_weights(tiny_model_dir, tmp_path, capsys):
    from agentgym_lightning.cli import main

    run = tmp_path / "run"
    trained = _run_with_checkpoint(tiny_model_dir, run)
    # The same weights saved as an ordinary model folder: eval of it and of the run must agree token for token.
    plain = tmp_path / "plain"
    trained.save_pretrained(plain)
    for item in tiny_model_dir.iterdir():  # the tokenizer and chat template
        if not (plain / item.name).exists():
            (plain / item.name).write_bytes(item.read_bytes())
    base = ["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "2", "--concurrency", "2", "--temperature", "0",
            "--max-tokens", "6", "--no-progress", "--json"]
    outputs = {}
    for name, model in (("run", run), ("plain", plain), ("base", tiny_model_dir)):
        assert main([*base, "--model", str(model), "--output", str(tmp_path / f"{name}.jsonl")]) == 0
        capsys.readouterr()
        rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        outputs[name] = sorted(json.dumps([s["completion"]["completion_token_ids"] for s in r["steps"]]) for r in rows)
    assert outputs["run"] == outputs["plain"]
    assert outputs["run"] != outputs["base"]  # the weights made a difference: the test can tell them apart
