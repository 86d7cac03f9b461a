"""The one writer behind every ``-o PATH`` (report, export, compare --report, study -o).

What ``PATH`` is decides how it is written:

- ``-``: standard output (binary, flushed), nothing on disk;
- a path that exists and is not a regular file (a character device such as ``/dev/null``,
  a named pipe, a Unix socket, or a symlink to one of those): written in place, streaming,
  never replaced (``/dev/null`` stays a device, a pipe's reader gets the bytes);
- a regular file, or a path that does not exist yet: written to a temporary file beside it
  and renamed over it only when complete (a failure leaves the old file and no temp file);
  a symlink to a regular file keeps the link and replaces its target.

Paths ending in ``.gz`` are gzip-compressed in every case. Failures raise a one-line
:class:`~perfscope.errors.StorageError` naming the path.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import socket
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from perfscope.errors import StorageError
from perfscope.profiler.segments import storage_error
from perfscope.profiler.store import write_stream_atomic

__all__ = ["STDOUT", "OutputKind", "output_kind", "write_output", "write_output_text"]

#: The ``-o`` value that means standard output.
STDOUT = "-"

OutputKind = Literal["stdout", "special", "regular", "directory"]


def output_kind(path: Path | str) -> OutputKind:
    """How :func:`write_output` would write ``path`` (symlinks followed)."""
    if str(path) == STDOUT:
        return "stdout"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "regular"  # to be created (a dangling symlink's target is created too)
    except OSError as exc:
        raise storage_error(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    return "regular" if stat.S_ISREG(st.st_mode) else "special"


@contextlib.contextmanager
def _open_in_place(path: Path) -> Iterator[BinaryIO]:
    """A binary stream into an existing non-regular file: a socket is connected to, any
    other (device, FIFO) opened for writing without truncation."""
    if stat.S_ISSOCK(os.stat(path).st_mode):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            with sock.makefile("wb") as f:
                yield f
        finally:
            sock.close()
        return
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "wb", buffering=1 << 16) as f:
        yield f


def _compressed(path: Path | str, f: BinaryIO, write: Callable[[BinaryIO], object]) -> None:
    if str(path).endswith(".gz"):
        with gzip.GzipFile(fileobj=f, mode="wb") as gz:
            write(gz)  # type: ignore[arg-type]  # GzipFile is a binary stream
    else:
        write(f)


def write_output(path: Path | str, write: Callable[[BinaryIO], object]) -> OutputKind:
    """Stream ``write(f)`` into ``path`` as the module docstring says; returns how it was
    written. A directory is refused (the caller decides which file inside it it means)."""
    kind = output_kind(path)
    if kind == "stdout":
        sys.stdout.flush()
        out = sys.stdout.buffer
        _compressed("", out, write)
        out.flush()
        return kind
    p = Path(path)
    if kind == "directory":
        raise StorageError(
            f"cannot write {p}: it is a directory; give a file name", path=str(p), errno=21
        )
    if kind == "special":
        try:
            with _open_in_place(p) as f:
                _compressed(p, f, write)
        except BrokenPipeError:
            pass  # the reader went away (a pipe into `head`): not an error of ours
        except OSError as exc:
            raise storage_error(p, exc) from None
        return kind
    target = p.resolve() if p.is_symlink() else p  # keep the link, replace its target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(target.parent, exc) from None
    # The run store's atomic writer (gzip by suffix): no temp file survives a failure.
    write_stream_atomic(target, write)
    return kind


def write_output_text(path: Path | str, text: str) -> OutputKind:
    """:func:`write_output` of ``text`` encoded as UTF-8."""
    data = text.encode("utf-8")
    return write_output(path, lambda f: f.write(data))
