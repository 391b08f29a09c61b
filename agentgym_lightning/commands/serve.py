"""``agentgym-lightning serve``: the standalone gateway, for agents that run elsewhere.

::

    agentgym-lightning serve --base-url http://gpu-1:8000/v1 --port 8100      # answered by that server
    agentgym-lightning serve --backend hf --host 0.0.0.0 --port 8100 --output runs/remote.jsonl   # token printed

Remote agents open episodes over HTTP, make their LLM calls against the base URL they are given
(answered by this server's policy, batched), post rewards and variables, and say ``done``; every
finished trajectory (token ids included) is appended to ``--output`` and readable at
``GET /episodes/{id}/trajectory``. The API: ``docs/remote-agents.md`` and
:mod:`agentgym_lightning.rollouts.http_agents`. Runs until Ctrl-C or SIGTERM (either ends the open
episodes as truncated and writes them to ``--output``).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
from typing import Any

__all__ = ["SignalWakeup", "register", "run"]


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "serve"
HELP = "serve episodes to agents running elsewhere (HTTP API: open, call, reward, done, read)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from agentgym_lightning.gateway.gateway import TOKEN_ENV

    """Add the ``serve`` subcommand."""
    from agentgym_lightning.policies import BACKENDS

    p = subparsers.add_parser(
        "serve",
        help=HELP,
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s; off loopback a token is required)")
    p.add_argument("--port", type=int, default=8100, help="port to bind, 0 for a free one (default: %(default)s)")
    p.add_argument("--token", default=None, help=f"bearer token clients must send (default: ${TOKEN_ENV}; generated off loopback)")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="openai", help="policy backend (default: %(default)s)")
    p.add_argument("--model", default=None, help="model (default: the server's first model for openai, the embedded one otherwise)")
    p.add_argument(
        "--base-url", action="append", default=[], help="OpenAI-compatible upstream (openai backend; repeat for replicas)"
    )
    p.add_argument("--concurrency", type=int, default=256, help="episodes open at once (default: %(default)s)")
    p.add_argument(
        "--agent-time-limit",
        type=float,
        default=300.0,
        help="seconds of its own time a remote agent may take per episode before it is truncated (default: %(default)s)",
    )
    p.add_argument("--max-turns", type=int, default=None, help="truncate episodes after this many LLM calls")
    p.add_argument("--output", "-o", default=None, help="append every finished trajectory here (JSONL)")
    p.add_argument("--policy-kwarg", action="append", default=[], metavar="KEY=VALUE", help="policy backend option (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; exit 0 on Ctrl-C or SIGTERM, 2 on a bad argument."""
    from agentgym_lightning.commands.eval import parse_kwargs
    from agentgym_lightning.gateway.gateway import TOKEN_ENV
    from agentgym_lightning.rollouts.http_agents import StandaloneGateway
    from agentgym_lightning.policies import DEFAULT_MODEL, make_policy

    try:
        kwargs = parse_kwargs(args.policy_kwarg, "--policy-kwarg")
        if args.base_url:
            if args.backend != "openai":
                raise ValueError("--base-url is for the openai backend")
            kwargs["base_url"] = args.base_url if len(args.base_url) > 1 else args.base_url[0]
        elif args.backend == "openai" and "base_url" not in kwargs and not os.environ.get("OPENAI_BASE_URL"):
            raise ValueError(
                "--backend openai (the default) answers through an OpenAI-compatible server: give its --base-url "
                "(e.g. --base-url http://gpu-1:8000/v1, or set $OPENAI_BASE_URL), or serve a local model with "
                "--backend hf [--model NAME]"
            )
        model = args.model if args.model is not None else ("" if args.backend == "openai" else DEFAULT_MODEL)
        policy = make_policy(args.backend, model, **kwargs)
        server = StandaloneGateway(
            policy,
            host=args.host,
            port=args.port,
            token=args.token or os.environ.get(TOKEN_ENV) or None,
            concurrency=args.concurrency,
            agent_time_limit=args.agent_time_limit,
            max_turns=args.max_turns,
            output=args.output,
        )
        server.start()
    except (ValueError, ImportError, FileNotFoundError, OSError) as exc:
        print(f"agentgym-lightning serve: {exc}", file=sys.stderr)
        return 2

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # docker stop, a scheduler: end like Ctrl-C (open episodes truncated, written)

    previous = signal.getsignal(signal.SIGTERM)
    with SignalWakeup() as wakeup:
        try:
            # After the wakeup fd (a SIGTERM that trips this handler also writes it), before the
            # URL is out (its first client may stop us at once).
            signal.signal(signal.SIGTERM, stop)
            print(f"listening on {server.url}", flush=True)
            if server.token:
                print(f"token: {server.token}", flush=True)
            while True:
                wakeup.wait()  # a handler that raised has run by the next bytecode
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            server.close()
            policy.close()
            print(f"served {server.opened} episodes ({server.finished} finished)", file=sys.stderr)
    return 0


class SignalWakeup:
    """Lets the main thread sleep until a signal comes, whichever thread the kernel hands it to.

    Python runs a signal's handler only on the main thread, between bytecodes, and a blocking
    call is cut short only by a signal the kernel hands to that very thread. A signal sent to the
    process may be taken by any of its threads (the server's, the driver's), and one taken by the
    main thread just before its sleep begins (after it released the GIL for it, say) is only
    noted: either way the handler is tripped and ``time.sleep(3600)`` sleeps on (the CI flake of
    ``test_sigterm_writes_open_episodes_as_truncated``: serve did not exit within 60 s of
    SIGTERM). Inside the block, the C-level handler of any signal with a Python handler installed
    writes the wakeup fd, on whichever thread takes the signal and whenever it comes, so
    :meth:`wait` returns (at once if the byte came first) and the handler runs. Install the
    handlers to wait for inside the block; on the main thread only.
    """

    def __enter__(self) -> SignalWakeup:
        self._receive, self._send = socket.socketpair()
        self._receive.setblocking(False)
        self._send.setblocking(False)
        self._previous = signal.set_wakeup_fd(self._send.fileno(), warn_on_full_buffer=False)
        return self

    def wait(self) -> None:
        """Block until at least one signal has come since the last call (or the block began)."""
        select.select([self._receive], [], [])
        try:
            self._receive.recv(4096)
        except BlockingIOError:
            pass

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._previous)
        self._receive.close()
        self._send.close()
