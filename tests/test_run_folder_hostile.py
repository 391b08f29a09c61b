"""A run folder is untrusted input to ``view``, ``report`` and ``sft``: special files, endless or
huge lines and wrong field types are refused in bounded time and memory, listed as problems, and
never harm another run's pages."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from agentgym_lightning import TrajectoryWriter
from agentgym_lightning.run_files import RunFileError, iter_lines, open_run_file
from agentgym_lightning.trajectory import SkippedLineWarning, load_trajectories
from agentgym_lightning.viewer.run import RunFolder

from tests.test_viewer import _episode

pytest.importorskip("starlette")


def good_run(folder):
    with TrajectoryWriter(folder / "trajectories" / "step-000001.jsonl") as w:
        w.write(_episode([("a", "b")], eid="fine"))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward/mean": 0.5}) + "\n")
    return folder


def test_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    # Before: open() of the FIFO waited for a writer forever; /dev/zero was read as one endless line.
    for path in (fifo, zero):
        with pytest.raises(RunFileError, match="not a regular file"):
            open_run_file(path)
        with pytest.raises(RunFileError):
            list(load_trajectories(path))
        with pytest.warns(SkippedLineWarning, match="not a regular file"):
            assert list(load_trajectories(path, on_error="skip")) == []


def test_a_line_over_the_bound_is_skipped_without_being_held(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"x" * 5000 + b"\nsecond\n" + b"y" * 3000)
    with open_run_file(path) as fh:
        assert list(iter_lines(fh, max_line_bytes=1000)) == [(1, b""), (2, b"second\n"), (3, b"")]
    with pytest.raises(RunFileError, match="over the 100 a run file may have"):
        open_run_file(path, max_bytes=100)


def test_wrong_seed_and_group_id_types_are_a_skipped_line_not_a_crash(tmp_path):
    path = tmp_path / "step-000001.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(_episode([("a", "b")], eid="fine"))
    record = json.loads(path.read_text().splitlines()[0])
    bad = [{**record, "episode_id": "x", "seed": {}}, {**record, "episode_id": "y", "group_id": 5}, {**record, "episode_id": 7}]
    with path.open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in bad)
    # Before: read as trajectories, and their sorting and pages raised (a 500, a report traceback).
    with pytest.raises(ValueError, match=r":2: not a trajectory \(TypeError: seed must be a whole number or null, got dict"):
        list(load_trajectories(path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [t.episode_id for t in load_trajectories(path, on_error="skip")] == ["fine"]
    messages = " | ".join(str(w.message) for w in caught)
    assert "group_id must be a string or null, got int" in messages and "episode_id must be a string, got int" in messages


def test_a_bad_run_never_harms_another_runs_pages(tmp_path):
    from starlette.testclient import TestClient

    from agentgym_lightning.viewer.app import make_app

    bad = good_run(tmp_path / "bad")
    os.mkfifo(bad / "trajectories" / "step-000002.jsonl")
    (bad / "trajectories" / "step-000003.jsonl").symlink_to("/dev/zero")
    with TrajectoryWriter(bad / "trajectories" / "step-000004.jsonl") as w:
        w.write(_episode([("a", "b")], eid="typed"))
    line = json.loads((bad / "trajectories" / "step-000004.jsonl").read_text())
    (bad / "trajectories" / "step-000004.jsonl").write_text(json.dumps({**line, "seed": {}, "group_id": 5}) + "\n")
    state = bad / "checkpoints" / "checkpoint-000001" / "trainer_state.json"
    state.parent.mkdir(parents=True)
    os.mkfifo(state)
    other = good_run(tmp_path / "other")
    client = TestClient(make_app([RunFolder(bad), RunFolder(other)]), raise_server_exceptions=False)
    assert client.get("/").status_code == 200
    for step in (2, 3):  # no episode file: a FIFO and a device are not served
        assert client.get(f"/runs/0/train/{step}").status_code == 404
    assert "group_id must be a string or null, got int" in client.get("/runs/0/train/4").text
    assert "fine" in client.get("/runs/1/train/1").text and client.get("/runs/1/train/1/fine").status_code == 200
    # The report reads the same files the same way: a page, not a traceback or a hang.
    from agentgym_lightning.viewer.pages import report

    assert "not a regular file" in report([RunFolder(bad)]) and "fine" in report([RunFolder(other)])


def test_metrics_that_are_no_regular_file_or_too_large_are_a_listed_problem(tmp_path, monkeypatch):
    from agentgym_lightning.viewer import run as run_module

    folder = good_run(tmp_path / "run")
    monkeypatch.setattr(run_module, "MAX_METRICS_BYTES", 10)
    runs = RunFolder(folder)
    # Before: read whole, however large (a 1.2 GB file: 3.7 GB and a MemoryError).
    assert runs.metrics() == []
    assert "over the 10 a run file may have" in runs.problems()[0]


def test_sft_sources_with_a_special_file_are_refused_in_one_line(tmp_path):
    from agentgym_lightning.training.sft.episodes import load_sources

    run = good_run(tmp_path / "run")
    (run / "trajectories" / "step-000002.jsonl").symlink_to("/dev/zero")
    # Before: /dev/zero was read as one endless line until a MemoryError traceback.
    with pytest.raises(RunFileError, match=r"step-000002.jsonl: not a regular file") as caught:
        load_sources([run])
    assert len(str(caught.value).splitlines()) == 1
