"""The Ray connection: joining a cluster or starting a private one on loopback that dies
with this process (a reaper kills it on every way out, SIGKILL included)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from perfscope.errors import UsageError
from perfscope.profiler.distributed.target import RayTarget


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs Ray: pip install 'perfscope[ray]' (or pip install ray)"
        ) from None
    return ray


#: Prefix of a private cluster's temp dir (``/tmp/perfscope-ray-<driver pid>-XXXX``): every
#: Ray process of that cluster names it on its command line or logs into it.
PRIVATE_DIR_PREFIX = "perfscope-ray-"

#: The private cluster's reaper (see :func:`_start_reaper`), while one runs.
_reaper: Any = None
#: The private cluster's temp dir, while one runs.
_private_dir: str | None = None


def private_cluster_pids() -> set[int]:
    """Processes of this process's private cluster (its Ray daemons and workers: named
    by its temp dir on their command line, or logging into it); empty without one."""
    tmp = _private_dir
    if tmp is None:
        return set()
    found: set[int] = set()
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                hit = tmp.encode() in f.read()
            hit = hit or any(os.readlink(f"/proc/{p}/fd/{fd}").startswith(tmp) for fd in "12")
        except OSError:
            continue
        if hit:
            found.add(int(p))
    found.discard(os.getpid())
    return found


_REAPER = r"""
import os, shutil, signal, sys, time
tmp = sys.argv[1]
sys.stdin.buffer.read()  # returns when the driver closes the pipe or dies (even SIGKILL)

def ours(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if tmp.encode() in f.read():
                return True
        for fd in ("1", "2"):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(tmp):
                return True
    except OSError:
        pass
    return False

me, quiet = os.getpid(), 0
deadline = time.monotonic() + 10
while quiet < 3 and time.monotonic() < deadline:
    found = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and ours(p)]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    quiet = 0 if found else quiet + 1
    time.sleep(0.1)
shutil.rmtree(tmp, ignore_errors=True)
"""


def _start_reaper(tmp: str) -> Any:
    """A small process that outlives nothing: it waits on a pipe from this process and,
    once the pipe closes (:func:`disconnect`, or this process dies, SIGKILL included),
    kills every process of the private cluster in ``tmp`` (found by the directory on
    their command line or as their log file) and removes ``tmp``."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", _REAPER, tmp],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C in the terminal does not reach it
        close_fds=True,
    )


def connect(target: RayTarget) -> bool:
    """Connect this process to ``target``'s cluster (or start a private local one) unless
    Ray is already initialised; True when this call did it, so the caller shuts Ray down
    after.

    A private cluster (``--ray`` or ``--ray local:N``) is always new, even beside a
    ``ray start`` cluster on this machine: it listens on loopback only, keeps its files in
    its own temp dir, and dies with this process (a reaper kills it on every way out).

    Raises:
        UsageError: Ray is not installed, or the cluster cannot be started or reached
            (with what to set when the cluster wants an auth token).
    """
    global _reaper, _private_dir
    ray = _import_ray()
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    env_address = os.environ.pop("RAY_ADDRESS", None) if target.address is None else None
    try:
        if target.address is None:
            import tempfile

            tmp = tempfile.mkdtemp(prefix=f"{PRIVATE_DIR_PREFIX}{os.getpid()}-", dir="/tmp")
            _reaper = _start_reaper(tmp)
            _private_dir = tmp
            kwargs.update(
                address="local",
                num_cpus=max(target.actors, os.cpu_count() or 1),
                _temp_dir=tmp,
                _node_ip_address="127.0.0.1",
            )
            loopback: contextlib.AbstractContextManager[None] = _loopback_only(ray)
        else:
            kwargs["address"] = target.address
            loopback = contextlib.nullcontext()
        # ray.init replaces the SIGTERM handler with sys.exit(): keep the caller's, so a
        # SIGTERM stops the run as perfscope handles it (Ray section kept, signal named).
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        try:
            with loopback:
                ray.init(**kwargs)
        except Exception as exc:
            _stop_reaper()
            raise UsageError(_connect_error(target, exc)) from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    finally:
        if env_address is not None:
            os.environ["RAY_ADDRESS"] = env_address
    return True


#: Ray's switch that, off, makes it take loopback as this node's address (it is meant for
#: laptops); read by ``ray._private.services.get_node_ip_address`` at call time.
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """While a private cluster starts: keep it on loopback.

    Ray 2.60 turns ``_node_ip_address="127.0.0.1"`` into the machine's outside address
    (``resolve_ip_for_localhost``), and then its GCS, raylet and workers listened on every
    interface (``::``) and its runtime-env agent on that address. With Ray's own cluster
    switch off, the node's address stays loopback and every one of them binds
    127.0.0.1 (the daemons inherit the variable; this process's value is put back after).
    """
    import importlib

    try:
        consts: Any = importlib.import_module("ray._private.ray_constants")
    except ImportError:  # another Ray layout: nothing to switch
        yield
        return
    old_env = os.environ.get(_RAY_LOOPBACK_ENV)
    old_flag = getattr(consts, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_LOOPBACK_ENV] = "0"
    consts.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(_RAY_LOOPBACK_ENV, None)
        else:
            os.environ[_RAY_LOOPBACK_ENV] = old_env
        if old_flag is not None:
            consts.ENABLE_RAY_CLUSTER = old_flag


def _connect_error(target: RayTarget, exc: BaseException) -> str:
    """The one-line reason a cluster could not be started or joined, with what to do."""
    text = str(exc)
    where = "start a local Ray cluster" if target.address is None else f"reach {target.address}"
    if "auth" in text.lower() or "token" in text.lower() or "UNAUTHENTICATED" in text:
        return (
            f"--ray: cannot {where}: the cluster requires token authentication; set "
            "RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, the token file "
            "RAY_AUTH_TOKEN_PATH, or the head's ~/.ray/auth_token copied here) in this shell "
            "(docs/scale.md)"
        )
    hint = ""
    if target.address is not None and os.environ.get("RAY_AUTH_MODE") != "token":
        # Ray 2.60 heads require a token by default and the failure often does not say so.
        hint = (
            " (if the cluster uses token authentication, Ray's default since 2.60, set "
            "RAY_AUTH_MODE=token in this shell; Ray then reads the head's token from "
            "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        )
    return f"--ray: cannot {where}: {_first_line(exc)}{hint}"


def _stop_reaper() -> None:
    """Close the reaper's pipe (it then kills what is left of the private cluster)."""
    global _reaper, _private_dir
    reaper, _reaper, _private_dir = _reaper, None, None
    if reaper is not None and reaper.stdin is not None:
        with contextlib.suppress(OSError):
            reaper.stdin.close()
        with contextlib.suppress(Exception):
            reaper.wait(timeout=15)


def disconnect() -> None:
    """Shut this process's Ray connection down (after :func:`connect` returned True), and a
    private cluster with it."""
    ray = _import_ray()
    with contextlib.suppress(Exception):  # a cluster that is already gone
        ray.shutdown()
    _stop_reaper()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
