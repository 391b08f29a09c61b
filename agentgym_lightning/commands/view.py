"""``agentgym-lightning view``: a local web app showing training runs, live as they are written.

::

    agentgym-lightning view runs/main                     # http://127.0.0.1:8765
    agentgym-lightning view runs/seed0 runs/seed1 --port 0   # several runs overlaid; a free port

The same views as ``agentgym-lightning report`` (curves, alarms, episodes by group, one episode
call by call), for every step and evaluation, refreshing while the run writes. It binds
127.0.0.1 only. See docs/viewer.md.
"""

from __future__ import annotations

import argparse
import socket
import sys

__all__ = ["register", "run"]


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "view"
HELP = "a local web app of training runs (curves, alarms, episodes call by call), live"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``view`` subcommand."""
    p = subparsers.add_parser(
        "view",
        help=HELP,
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a train run's output folder (several are overlaid)")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1, 0 for a free one (default: %(default)s)")
    p.add_argument("--refresh", type=float, default=3.0, metavar="SECONDS", help="how often pages check for new data (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``view`` command: serves until Ctrl-C; exit 2 when a run folder is missing."""
    import uvicorn

    from agentgym_lightning.viewer.app import make_app
    from agentgym_lightning.viewer.run import RunFolder

    try:
        runs = [RunFolder(r) for r in args.runs]
    except FileNotFoundError as exc:
        print(f"agentgym-lightning view: {exc}", file=sys.stderr)
        return 2
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as exc:
        print(f"agentgym-lightning view: cannot bind 127.0.0.1:{args.port} ({exc.strerror}); try --port 0", file=sys.stderr)
        return 2
    print(f"viewing {', '.join(r.name for r in runs)} at http://127.0.0.1:{sock.getsockname()[1]}  (Ctrl-C to stop)", flush=True)
    server = uvicorn.Server(uvicorn.Config(make_app(runs, refresh_ms=int(args.refresh * 1000)), log_level="warning"))
    server.run(sockets=[sock])
    return 0
