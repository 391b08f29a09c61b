"""Checkpoints keep what was done: stale temporaries cleaned, a full disk or NaN weights never
replace a good checkpoint, and loading runs no pickled code."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest
import torch

from agentgym_lightning.training import checkpoint as ckpt
from agentgym_lightning.training.checkpoint import (
    NonFiniteWeightsError,
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def save(tmp_path, step, model, optimizer, scheduler, keep=None):
    return save_checkpoint(tmp_path, model=model, peft=False, optimizer=optimizer, scheduler=scheduler,
                           state=TrainerState(step=step, config={}, history=[], extra={}), keep=keep)


def test_a_stale_temporary_folder_from_a_killed_save_is_removed(tmp_path):
    model, optimizer, scheduler = parts()
    stale = tmp_path / "checkpoints" / ".checkpoint-000003.tmp-abc123"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    save(tmp_path, 4, model, optimizer, scheduler)
    assert not stale.exists()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-000004"]


def test_a_full_disk_keeps_the_previous_checkpoint_and_leaves_no_temporary(tmp_path, monkeypatch):
    model, optimizer, scheduler = parts()
    first = save(tmp_path, 1, model, optimizer, scheduler, keep=1)
    real_save = torch.save

    def full(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        save(tmp_path, 2, model, optimizer, scheduler, keep=1)
    assert latest_checkpoint(tmp_path) == first and (first / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-000001"]


def test_nan_weights_are_never_saved_so_a_good_checkpoint_is_never_pruned(tmp_path):
    model, optimizer, scheduler = parts()
    good = save(tmp_path, 1, model, optimizer, scheduler, keep=1)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match="step 2 are not finite"):
        save(tmp_path, 2, model, optimizer, scheduler, keep=1)
    assert latest_checkpoint(tmp_path) == good


def test_resume_loads_with_weights_only_and_restores_every_rng(tmp_path, monkeypatch):
    model, optimizer, scheduler = parts()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    calls = []
    real_load = torch.load

    def load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "load", load)
    fresh, fresh_optimizer, fresh_scheduler = parts()
    load_checkpoint(saved, model=fresh, peft=False, optimizer=fresh_optimizer, scheduler=fresh_scheduler)
    assert calls == [True, True, True]  # optimizer, scheduler, rng: no pickled code is ever loaded
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    assert fresh_scheduler.last_epoch == scheduler.last_epoch
    assert fresh_optimizer.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]


def test_a_checkpoint_with_pickled_code_is_refused(tmp_path):
    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)

    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    torch.save({"state": Payload()}, saved / "optimizer.pt")
    ckpt._write_manifest(saved, 1)  # a crafted checkpoint: its manifest matches the planted file
    with pytest.raises(ValueError, match="pickled Python objects, which are not loaded"):
        load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert not (tmp_path / "pwned").exists()


def test_an_older_checkpoints_numpy_rng_state_still_loads(tmp_path):
    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    np.random.seed(5)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, saved / "rng.pt")
    (saved / ckpt.MANIFEST).unlink()  # older checkpoints had no manifest either
    expected = float(np.random.rand())
    load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert float(np.random.rand()) == expected


@pytest.mark.parametrize("damage", ["truncate weights", "zero weights", "garbage header", "truncate optimizer"])
def test_a_corrupt_checkpoint_is_refused_in_one_line(tmp_path, damage):
    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    assert (saved / ckpt.MANIFEST).is_file()
    weights, state = saved / "model.safetensors", saved / "optimizer.pt"
    if damage == "truncate weights":
        weights.write_bytes(weights.read_bytes()[:40])
    elif damage == "zero weights":
        weights.write_bytes(bytes(weights.stat().st_size))
    elif damage == "garbage header":
        weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    else:
        state.write_bytes(state.read_bytes()[:100])
    # Before: a raw safetensors/torch traceback (or, for zeroed weights, zero weights loaded).
    with pytest.raises(ckpt.CorruptCheckpointError, match=r"checkpoint-000001 is corrupt: (model.safetensors|optimizer.pt)") as caught:
        load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert len(str(caught.value).splitlines()) == 1
    with pytest.raises(ckpt.CorruptCheckpointError):
        ckpt.find_checkpoint(saved)


def test_a_checkpoint_without_manifest_that_cannot_be_read_is_one_line_too(tmp_path):
    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    (saved / ckpt.MANIFEST).unlink()  # saved before manifests existed
    (saved / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ckpt.CorruptCheckpointError, match="model.safetensors cannot be read"):
        load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)


def test_resuming_a_run_takes_its_newest_intact_checkpoint_and_says_so(tmp_path):
    model, optimizer, scheduler = parts()
    older = save(tmp_path, 1, model, optimizer, scheduler)
    newest = save(tmp_path, 2, model, optimizer, scheduler)
    (newest / "model.safetensors").write_bytes(b"")
    # Before: the corrupt newest one was taken (and its load ended in a traceback).
    with pytest.warns(ckpt.CorruptCheckpointWarning, match=r"checkpoint-000002 is corrupt: model.safetensors has 0 bytes.*resuming from checkpoint-000001"):
        assert ckpt.find_checkpoint(tmp_path) == older
    assert ckpt.intact_checkpoint(tmp_path)[0] == older
    (older / "optimizer.pt").unlink()
    with pytest.raises(ckpt.CorruptCheckpointError, match="every checkpoint in .* is corrupt"):
        ckpt.intact_checkpoint(tmp_path)


def test_a_full_disk_says_how_much_room_a_checkpoint_needs(tmp_path, monkeypatch):
    model, optimizer, scheduler = parts()
    needed = ckpt.checkpoint_bytes(model, False, optimizer)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert needed >= 3 * weights  # the weights and AdamW's two moments
    with pytest.raises(OSError, match=r"has [\d,]+ (KB|MB) free and a checkpoint of this run needs about [\d,]+ (KB|MB)") as caught:
        ckpt.check_checkpoint_space(tmp_path / "run", 2**62)
    assert caught.value.errno == errno.ENOSPC
    ckpt.check_checkpoint_space(tmp_path / "run", 1)

    class SafetensorError(Exception):  # what safetensors raises for a full disk (not an OSError)
        pass

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    # Before: the SafetensorError escaped the trainer's full-disk handling as a traceback.
    with pytest.raises(OSError, match=r"No space left on device \(a checkpoint of this run needs about .*free\)") as caught:
        save(tmp_path, 1, model, optimizer, scheduler)
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in (tmp_path / "checkpoints").iterdir()]


def test_a_checkpoint_with_nan_weights_and_a_recomputed_manifest_is_refused_on_resume(tmp_path):
    from safetensors.torch import load_file, save_file

    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    weights = load_file(str(saved / "model.safetensors"))
    weights["weight"][0, 0] = float("nan")
    save_file(weights, str(saved / "model.safetensors"), metadata={"format": "pt"})
    ckpt._write_manifest(saved, 1)  # what an edit that recomputes the manifest leaves
    # Before: loaded, and every later episode failed on NaN probabilities.
    with pytest.raises(ckpt.CorruptCheckpointError, match=r"model.safetensors holds non-finite weights \(1 tensors, e.g. weight\)") as caught:
        load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert len(str(caught.value).splitlines()) == 1
    assert bool(torch.isfinite(model.weight).all())


def test_final_is_never_written_from_non_finite_weights(tmp_path):
    model, optimizer, scheduler = parts()
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    # Before: final/ was written with the infinite weight.
    with pytest.raises(NonFiniteWeightsError, match="final weights are not finite"):
        ckpt.save_final_model(tmp_path / "final", model=model, tokenizer=None, peft=False)
    assert not (tmp_path / "final").exists()


def test_a_manifest_moved_from_another_checkpoint_does_not_pass(tmp_path):
    model, optimizer, scheduler = parts()
    older = save(tmp_path, 1, model, optimizer, scheduler)
    optimizer.step()
    newest = save(tmp_path, 2, model, optimizer, scheduler)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json", ckpt.MANIFEST):
        (newest / name).write_bytes((older / name).read_bytes())
    # Before: step 1's files passed as checkpoint-000002.
    with pytest.raises(ckpt.CorruptCheckpointError, match=r"checkpoint-000002 is corrupt: its manifest.json is the one of step 1"):
        ckpt.verify_checkpoint(newest)
    with pytest.warns(ckpt.CorruptCheckpointWarning, match="resuming from checkpoint-000001"):
        assert ckpt.find_checkpoint(tmp_path) == older


def test_a_newest_checkpoint_whose_manifest_was_deleted_falls_back_to_the_older_intact_one(tmp_path):
    model, optimizer, scheduler = parts()
    older = save(tmp_path, 1, model, optimizer, scheduler)
    newest = save(tmp_path, 2, model, optimizer, scheduler)
    (newest / ckpt.MANIFEST).unlink()
    (newest / "model.safetensors").write_bytes(b"\x00" * 16)
    # Before: the newest was taken unverified, and its load failed with no fallback.
    with pytest.warns(ckpt.CorruptCheckpointWarning, match=r"checkpoint-000002 is corrupt: its manifest.json is missing.*resuming from checkpoint-000001"):
        assert ckpt.find_checkpoint(tmp_path) == older


def test_a_checkpoint_copied_from_another_run_does_not_pass(tmp_path):
    model, optimizer, scheduler = parts()
    ours = tmp_path / "ours"
    older = save(ours, 1, model, optimizer, scheduler)
    save(ours, 2, model, optimizer, scheduler)
    theirs = save(tmp_path / "theirs", 2, model, optimizer, scheduler)
    target = ours / "checkpoints" / "checkpoint-000002"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "trainer_state.json", ckpt.MANIFEST):
        (target / name).write_bytes((theirs / name).read_bytes())
    # Before: another run's step 2 (its manifest matching its files) passed as this run's.
    with pytest.raises(ckpt.CorruptCheckpointError, match=r"checkpoint-000002 is another run's checkpoint: its manifest.json names run"):
        ckpt.verify_checkpoint(target)
    with pytest.warns(ckpt.CorruptCheckpointWarning, match="resuming from checkpoint-000001"):
        assert ckpt.find_checkpoint(ours) == older
    assert (ours / ckpt.RUN_FILE).is_file()


def test_saved_config_reads_the_checkpoints_config_and_keeps_only_known_fields(tmp_path):
    model, optimizer, scheduler = parts()
    saved = save_checkpoint(tmp_path, model=model, peft=False, optimizer=optimizer, scheduler=scheduler,
                            state=TrainerState(step=1, config={"model": "m", "seed": 3, "gone": 1}, history=[], extra={}))
    assert ckpt.saved_config(saved) == {"model": "m", "seed": 3, "gone": 1}
    # a field this version does not know (written by another) is left out, not an error downstream
    assert ckpt.saved_config(saved, ["model", "seed", "lr"]) == {"model": "m", "seed": 3}


@pytest.mark.parametrize("text", ["", "{not json", "[]", '{"step": 1}'])
def test_saved_config_of_an_unreadable_trainer_state_is_a_corrupt_checkpoint(tmp_path, text):
    (tmp_path / "trainer_state.json").write_text(text, encoding="utf-8")
    with pytest.raises(ckpt.CorruptCheckpointError, match="trainer_state.json"):
        ckpt.saved_config(tmp_path)
