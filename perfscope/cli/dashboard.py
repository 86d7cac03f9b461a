"""``perfscope dashboard``: serve the Dash dashboard over a runs directory."""

from __future__ import annotations

import argparse
import contextlib
import socket
from pathlib import Path

from perfscope.cli._argtypes import add_runs_dir
from perfscope.cli.safe import SafeConsole as Console
from perfscope.errors import UsageError

__all__ = ["register"]


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < v < 65536:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, got {v}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {v}")
    return v


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope dashboard``."""
    p = subparsers.add_parser(
        "dashboard",
        help="interactive dashboard over a runs directory (Dash, in the browser)",
        description=(
            "Serve an interactive dashboard of the runs in a directory: runs table, run "
            "detail, comparison, sweeps, roofline explorer and hardware database. Binds "
            "127.0.0.1 unless --host says otherwise; new runs appear without a restart."
        ),
    )
    add_runs_dir(p)
    p.add_argument(
        "--host",
        default=None,
        help="address to bind (default 127.0.0.1; any other address exposes your runs)",
    )
    p.add_argument("--port", type=_port, default=None, help="port (default 8050)")
    p.add_argument(
        "--poll-interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="how often the runs page rescans the directory (default 2)",
    )
    p.add_argument(
        "--hwdb-dir",
        action="append",
        default=[],
        type=Path,
        help="extra hardware database directory (repeatable)",
    )
    p.set_defaults(handler=_cmd_dashboard)


def _cmd_dashboard(args: argparse.Namespace, console: Console) -> int:
    from perfscope.dashboard.app import DEFAULT_HOST, DEFAULT_PORT, create_app, is_loopback, serve
    from perfscope.profiler.store import default_runs_root

    root: Path = args.runs_dir or default_runs_root()
    if root.exists() and not root.is_dir():
        raise UsageError(f"--runs-dir {root}: not a directory")
    for d in args.hwdb_dir:
        if not d.is_dir():
            raise UsageError(f"--hwdb-dir {d}: no such directory")
    host = args.host or DEFAULT_HOST
    port = args.port or DEFAULT_PORT
    err = Console(stderr=True)
    if not is_loopback(host):
        err.print(
            f"[yellow]warning:[/] binding {host}: anyone who can reach this machine on port "
            f"{port} can read every run in {root} (no authentication). Use the default "
            "127.0.0.1 and an SSH tunnel instead where you can.",
            highlight=False,
        )
    if not root.exists():
        err.print(f"note: {root} does not exist yet; runs appear once it does", highlight=False)
    _check_can_listen(host, port)
    app = create_app(root, poll_interval_s=args.poll_interval, hwdb_dirs=args.hwdb_dir)
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"perfscope dashboard on http://{shown}:{port}/ over {root.resolve()} (Ctrl-C stops)",
        highlight=False,
    )
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a server stops
        serve(app, host=host, port=port)
    return 0


def _check_can_listen(host: str, port: int) -> None:
    """Fail with a one-line usage error when ``host:port`` cannot be bound (port in use,
    address not on this machine) instead of the server's own exit."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: cannot resolve ({exc.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port "
                "or --host"
            ) from None
