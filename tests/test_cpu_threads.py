"""torch's idle OpenMP threads sleep for a Python-API user as for the command (issue 37, item 7):
the package's import sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads OpenMP, a policy the user
set is left alone, and a trainer in a process that loaded torch first says what to do, once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agentgym_lightning.cpu_threads import SpinningThreadsWarning, sleeping_cpu_threads, warn_if_threads_spin

# libgomp (torch's OpenMP on Linux) prints the settings it read at load with OMP_DISPLAY_ENV=VERBOSE;
# GOMP_SPINCOUNT says how long an idle thread spins: 0 when PASSIVE, 300000 by default.
_PYTHON_API = (
    "import os\n"
    "from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer\n"
    "import torch\n"
    "torch.ones(64).sum()\n"
    "print(os.environ.get('OMP_WAIT_POLICY'))\n"
)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_DISPLAY_ENV")}
    return subprocess.run([sys.executable, "-c", code], env={**clean, "OMP_DISPLAY_ENV": "VERBOSE", **env},
                          capture_output=True, text=True, check=True, timeout=300)


def _spin_count(stderr: str) -> str | None:
    line = next((line for line in stderr.splitlines() if "GOMP_SPINCOUNT" in line), None)
    return line.split("=")[1].strip().strip("'") if line else None


def test_a_python_api_user_who_imports_the_package_first_gets_sleeping_threads():
    done = _run(_PYTHON_API)
    assert done.stdout.split() == ["PASSIVE"]
    if _spin_count(done.stderr) is None:
        pytest.skip("this torch's OpenMP does not print its settings (not libgomp)")
    assert _spin_count(done.stderr) == "0"  # OpenMP itself read PASSIVE: idle threads do not spin
    # torch loaded first: OpenMP has read its default already, and nothing is changed
    first = _run("import torch\n" + _PYTHON_API)
    assert first.stdout.split() == ["None"] and _spin_count(first.stderr) == "300000"


def test_a_policy_the_user_set_is_left_alone():
    done = _run(_PYTHON_API, OMP_WAIT_POLICY="ACTIVE")
    assert done.stdout.split() == ["ACTIVE"]
    assert _spin_count(done.stderr) in (None, "30000000000")


def test_sleeping_threads_are_set_only_before_torch_and_only_when_unset(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    assert sleeping_cpu_threads() is False and "OMP_WAIT_POLICY" not in os.environ  # torch loaded: too late
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert sleeping_cpu_threads() is False and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert sleeping_cpu_threads() is True and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_a_trainer_after_torch_was_imported_first_warns_once_with_what_to_do(monkeypatch):
    from agentgym_lightning import cpu_threads

    monkeypatch.setattr(cpu_threads, "_warned", False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert warn_if_threads_spin(2) is False  # the user chose: nothing to say
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert warn_if_threads_spin(1) is False  # one thread has no sibling to spin for
    with pytest.warns(SpinningThreadsWarning, match="Import agentgym_lightning before torch, or start Python with OMP_WAIT_POLICY=PASSIVE"):
        assert warn_if_threads_spin(2) is True
    assert warn_if_threads_spin(2) is False  # once per process


def test_split_threads_gives_the_decode_a_quarter_and_the_update_the_rest_at_least_one_each():
    from agentgym_lightning.cpu_threads import split_threads

    assert split_threads(1) == (1, 1)
    assert split_threads(2) == (1, 1)
    assert split_threads(4) == (3, 1)
    assert split_threads(16) == (12, 4)
    with pytest.raises(ValueError, match="total must be >= 1"):
        split_threads(0)


class _Generator:
    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self.decode_threads = None


def test_share_cores_splits_this_threads_torch_threads_with_a_cpu_generator_and_gives_them_back():
    torch = pytest.importorskip("torch")
    from agentgym_lightning.cpu_threads import share_cores

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        generator = _Generator("cpu")
        back = share_cores(generator, update_on_cpu=True)
        assert torch.get_num_threads() == 3 and generator.decode_threads == 1
        back()
        assert torch.get_num_threads() == 4 and generator.decode_threads == 4
        # Nothing to split: the update on a GPU, the generator on a GPU, or one that decodes elsewhere.
        for other, on_cpu in ((_Generator("cpu"), False), (_Generator("meta"), True), (object(), True)):
            share_cores(other, update_on_cpu=on_cpu)()
            assert torch.get_num_threads() == 4 and getattr(other, "decode_threads", None) is None
    finally:
        torch.set_num_threads(before)


def test_torch_threads_sets_this_threads_count_for_a_span_and_leaves_other_threads_theirs():
    torch = pytest.importorskip("torch")
    import threading

    from agentgym_lightning.cpu_threads import torch_threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        inside: dict[str, int] = {}

        def other() -> None:
            with torch_threads(1):
                inside["other"] = torch.get_num_threads()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert inside == {"other": 1} and torch.get_num_threads() == 2  # OpenMP counts per thread
        with torch_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with torch_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
