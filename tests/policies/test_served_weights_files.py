"""The served-weights reader reads only what the writer wrote: a regular file, never a link or a
FIFO planted in the shared folder."""

from __future__ import annotations

import os

import pytest
import torch

from agentgym_lightning.policies.served_weights import WEIGHTS_FILE, read_weights, write_weights


def test_what_the_writer_wrote_is_read_back(tmp_path):
    write_weights([("w", torch.ones(2, 2))], tmp_path)
    assert torch.equal(read_weights(tmp_path)["w"], torch.ones(2, 2))


def test_a_planted_symlink_is_refused_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_weights([("w", torch.full((2, 2), 7.0))], elsewhere)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / WEIGHTS_FILE).symlink_to(elsewhere / WEIGHTS_FILE)
    # Before: the link was followed and its target's weights loaded.
    with pytest.raises(ValueError, match="is a symlink, which the trainer never writes"):
        read_weights(shared)


def test_a_planted_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / WEIGHTS_FILE)
    with pytest.raises(ValueError, match="not a regular file"):
        read_weights(tmp_path)


def test_no_weights_file_says_where_the_server_must_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="must read the folder the trainer writes to"):
        read_weights(tmp_path)


def test_the_vllm_reload_checks_the_file_before_vllm_opens_it_by_path(tmp_path):
    from agentgym_lightning.policies.served_weights import WeightSyncExtension

    class Worker(WeightSyncExtension):
        reloaded: list[str] = []

        def reload_weights(self, weights_path, is_checkpoint_format):
            self.reloaded.append(weights_path)

    elsewhere = tmp_path / "elsewhere"
    write_weights([("w", torch.ones(1))], elsewhere)
    (tmp_path / WEIGHTS_FILE).symlink_to(elsewhere / WEIGHTS_FILE)
    with pytest.raises(ValueError, match="is a symlink"):
        Worker().agentgym_reload_weights(str(tmp_path))
    assert Worker.reloaded == []
