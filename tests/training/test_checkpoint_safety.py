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
    with pytest.raises(ValueError, match="pickled Python objects, which are not loaded"):
        load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert not (tmp_path / "pwned").exists()


def test_an_older_checkpoints_numpy_rng_state_still_loads(tmp_path):
    model, optimizer, scheduler = parts()
    saved = save(tmp_path, 1, model, optimizer, scheduler)
    np.random.seed(5)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, saved / "rng.pt")
    expected = float(np.random.rand())
    load_checkpoint(saved, model=model, peft=False, optimizer=optimizer, scheduler=scheduler)
    assert float(np.random.rand()) == expected
