"""What a generator *server* loads from us so the trainer can replace its weights over HTTP and
every answer says which weights wrote it.

The trainer (:class:`~agentgym_lightning.policies.vllm_server.VLLMServerPolicy`) syncs a server
in four HTTP calls, the same for ``vllm serve`` and our own
:class:`~agentgym_lightning.policies.policy_server.PolicyServer`:

1. the weights are written, atomically, as ``model.safetensors`` to a folder both sides can read
   (:func:`write_weights`);
2. ``POST /collective_rpc`` ``{"method": "agentgym_reload_weights", "kwargs": {"weights_path":
   folder}}``: every vLLM worker reloads from that folder (:class:`WeightSyncExtension`, vLLM's
   ``--worker-extension-cls``; ``/collective_rpc`` is a dev-mode route, ``VLLM_SERVER_DEV_MODE=1``);
3. ``POST /reset_prefix_cache?reset_running_requests=true``: cached keys and values of the old
   weights are dropped (running requests are preempted and resume on the new weights);
4. ``POST /agentgym/weights_version`` ``{"version": "..."}``: from now on every response carries
   that version in the :data:`VERSION_HEADER` header (:class:`WeightsVersionMiddleware`, vLLM's
   ``--middleware``).

A server starts at version :data:`INITIAL_VERSION` (the weights it was started with), so one that
restarted, or a replica a sync missed, answers with a version the trainer does not expect: the
answer is refused and counted, never trained on as the current policy's.

This module is imported inside the server's processes: it needs nothing beyond the standard
library at import time (torch and safetensors are imported where they are used).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "VERSION_HEADER",
    "VERSION_PATH",
    "INITIAL_VERSION",
    "RELOAD_METHOD",
    "WEIGHTS_FILE",
    "WeightSyncExtension",
    "WeightsVersionMiddleware",
    "write_weights",
    "unique_tensors",
    "read_weights",
    "check_written",
    "refresh_tied_lm_head",
]

#: The response header naming the weights version that answered (lower case, as ASGI sends it).
VERSION_HEADER = "x-agentgym-weights-version"
#: ``GET`` reads the server's weights version, ``POST {"version": str}`` sets it.
VERSION_PATH = "/agentgym/weights_version"
#: The version of the weights a server was started with.
INITIAL_VERSION = "0"
#: The worker method (``/collective_rpc``) that reloads the weights from the shared folder.
RELOAD_METHOD = "agentgym_reload_weights"
#: The file the weights are written to, in the shared folder.
WEIGHTS_FILE = "model.safetensors"


def unique_tensors(weights: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``(name, tensor)`` pairs, detached, each tensor once under its first name: a weight tied to
    another (the LM head to the embeddings) is left out, since vLLM and transformers tie it again."""
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for name, tensor in weights:
        ptr = tensor.data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            out.append((name, tensor.detach()))
    return out


def write_weights(weights: Iterable[tuple[str, Any]], folder: str | Path) -> Path:
    """Write ``(name, tensor)`` pairs as one safetensors file in ``folder``, atomically (a reader
    never sees half a file): to a temporary name, then renamed. Tied weights are written once
    (:func:`unique_tensors`)."""
    from safetensors.torch import save_file

    tensors = {name: tensor.to("cpu").contiguous() for name, tensor in unique_tensors(weights)}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / WEIGHTS_FILE
    tmp = folder / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, target)
    return target


def read_weights(folder: str | Path) -> dict[str, Any]:
    """The tensors :func:`write_weights` wrote to ``folder``: a regular file, never a symlink
    (the writer renames a file it wrote into place; a link there was planted by someone else in
    the shared folder, and may lead anywhere). Raises ``FileNotFoundError`` when there is none,
    ``ValueError`` when it is not a regular file of its own."""
    from safetensors.torch import load_file

    fd = _open_written(folder)
    try:
        # The file just opened and checked, by its descriptor, where /proc names it (Linux).
        by_fd = f"/proc/self/fd/{fd}"
        return load_file(by_fd if os.path.exists(by_fd) else str(Path(folder) / WEIGHTS_FILE))
    finally:
        os.close(fd)


def check_written(folder: str | Path) -> None:
    """Raise as :func:`read_weights` does unless ``folder`` holds a weights file the writer could
    have written (a regular file, no link); for readers that open it by path themselves (vLLM)."""
    os.close(_open_written(folder))


def _open_written(folder: str | Path) -> int:
    """A descriptor of ``folder``'s weights file, opened only if it is a regular file, not a link."""
    path = Path(folder) / WEIGHTS_FILE
    try:
        # O_NOFOLLOW: a symlink is refused by the open itself, so no link swapped in after a
        # check is followed; O_NONBLOCK: a FIFO planted there does not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no {WEIGHTS_FILE} in {folder}: the generator server must read the folder the trainer writes to "
            "(the same path on both machines: a shared or network file system)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path} is a symlink, which the trainer never writes: not read (remove it)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path} is not a regular file, which the trainer always writes: not read (remove it)")
    return fd


def refresh_tied_lm_head(worker: Any) -> bool:
    """Runs inside each vLLM worker after a reload. A LM head tied to the embeddings is not in
    the pushed weights (vLLM ties it itself), so vLLM's reload does not re-process it, and on CPU
    its GEMM kernel keeps a packed copy of the *old* embeddings. Re-process it from the new ones."""
    model = worker.get_model()
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or getattr(lm_head, "weight", None) is not getattr(embed, "weight", None):
        return False
    method = getattr(lm_head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(lm_head)
    return True


class WeightSyncExtension:
    """Methods added to every vLLM worker (``vllm serve --worker-extension-cls
    agentgym_lightning.policies.served_weights.WeightSyncExtension``), called through
    ``/collective_rpc``. ``self`` is the vLLM worker."""

    def agentgym_reload_weights(self, weights_path: str) -> bool:
        """Reload every weight from ``weights_path`` (vLLM's ``reload_weights`` in checkpoint
        format), then re-process a LM head tied to the embeddings (on CPU its GEMM keeps a packed
        copy of the old embeddings, which the reload does not refresh). Returns whether there was
        a tied head. A symlink or a special file planted as the weights file is refused first."""
        check_written(weights_path)
        self.reload_weights(weights_path=str(weights_path), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return refresh_tied_lm_head(self)


class WeightsVersionMiddleware:
    """ASGI middleware (``vllm serve --middleware
    agentgym_lightning.policies.served_weights.WeightsVersionMiddleware``; :class:`PolicyServer`
    adds it itself): answers ``GET``/``POST`` :data:`VERSION_PATH` and adds :data:`VERSION_HEADER`
    to every other response — the version when the request arrived, or ``"<then>-><now>"`` when
    a sync happened while it was being answered (then it is stale by construction).

    One version per server process: with ``vllm serve --api-server-count N > 1`` each API process
    would keep its own, so run one (the default).

    Setting the version takes the server's bearer token when it has one: ``token``, by default
    ``$VLLM_API_KEY`` (``vllm serve --api-key`` is not visible to a middleware: set the variable).
    """

    def __init__(self, app: Any, token: str | None = None) -> None:
        self.app = app
        self.version = INITIAL_VERSION
        self.token = token if token is not None else os.environ.get("VLLM_API_KEY") or None

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == VERSION_PATH:
            await self._version_route(scope, receive, send)
            return
        arrived = self.version

        async def send_with_version(message: Mapping[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                now = self.version
                value = arrived if now == arrived else f"{arrived}->{now}"
                message = {**message, "headers": [*message.get("headers", []), (VERSION_HEADER.encode(), value.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_version)

    async def _version_route(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        method = scope.get("method", "GET")
        status = 200
        headers = dict(scope.get("headers") or [])
        if method == "POST" and self.token and headers.get(b"authorization", b"").decode() != f"Bearer {self.token}":
            status = 401
        elif method == "POST":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            try:
                version = json.loads(body or b"null")["version"]
                if not isinstance(version, str) or not version:
                    raise TypeError
                self.version = version
            except (ValueError, KeyError, TypeError):
                status = 400
        elif method != "GET":
            status = 405
        problem = {401: "a bearer token is required to set the version", 405: "GET or POST"}.get(status, 'POST {"version": "<non-empty string>"}')
        payload: dict[str, Any] = {"version": self.version} if status == 200 else {"error": problem}
        raw = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": raw})
