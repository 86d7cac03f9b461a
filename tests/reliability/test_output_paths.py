"""``-o PATH`` of report and export: a regular file is replaced atomically, a device, named
pipe, socket or symlink to one is written in place (never replaced), ``-`` is stdout."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from tests.data.runs.builders import synthetic_run
from tests.reliability.helpers import cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_run(tmp_path_factory.mktemp("outputs"), 40, telemetry=False)


def _read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    def reader() -> None:
        with open(path, "rb") as f:
            into.append(f.read())

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    "argv",
    [
        ("export", "--format", "json"),
        ("export", "--format", "perfetto"),
        ("report",),
    ],
    ids=["export-json", "export-perfetto", "report"],
)
@pytest.mark.fault(
    fault="`-o` a named pipe",
    before="replaced by a regular file; the reader got nothing (issue 26)",
    after="written in place; still a FIFO",
    kept="the reader gets the whole export and report",
)
def test_named_pipe_output_reaches_its_reader_and_stays_a_pipe(
    run_dir: Path, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    proc = cli(*argv, str(run_dir), "-o", str(fifo), runs=tmp_path, timeout=120)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the pipe was replaced by a file"
    assert got and len(got[0]) > 1000, "nothing reached the pipe's reader"
    if argv[-1] == "json":
        assert json.loads(got[0])["manifest"]["run_id"]
    if argv[0] == "report":
        assert got[0].lstrip().lower().startswith(b"<!doctype html")
    assert not list(tmp_path.glob(".out.fifo.*")), "a temp file was left beside the pipe"


@pytest.mark.fault(
    fault="`-o /dev/null` as root",
    before="/dev/null replaced by a regular file, exit 0 (issue 26)",
    after="written in place",
    kept="the device itself (same inode and rdev)",
)
def test_dev_null_stays_a_character_device(run_dir: Path, tmp_path: Path) -> None:
    before = os.stat("/dev/null")
    for argv in (("export", "--format", "json"), ("report",)):
        proc = cli(*argv, str(run_dir), "-o", "/dev/null", runs=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        after = os.stat("/dev/null")
        assert stat.S_ISCHR(after.st_mode)
        assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


@pytest.mark.fault(
    fault="`-o` a symlink to a named pipe",
    before="the link replaced by a regular file (issue 26)",
    after="written through; the link kept",
    kept="the reader gets the export",
)
def test_symlink_to_a_pipe_is_written_through_and_the_link_kept(
    run_dir: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "real.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    proc = cli("export", "--format", "json", str(run_dir), "-o", str(link), runs=tmp_path)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(fifo)
    assert json.loads(got[0])["requests"]


@pytest.mark.fault(
    fault="`-o` a symlink to a regular file",
    before="not recorded (guard older than issue 26)",
    after="the target replaced; the link kept",
    kept="the export in the target",
)
def test_symlink_to_a_regular_file_keeps_the_link_and_replaces_the_target(
    run_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    proc = cli("export", "--format", "json", str(run_dir), "-o", str(link), runs=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink()
    assert json.loads(target.read_text())["requests"]


@pytest.mark.fault(
    fault="`-o` a Unix socket",
    before="replaced by a regular file (issue 26)",
    after="streamed to the listener",
    kept="the listener gets the export",
)
def test_unix_socket_output_is_streamed_to_the_listener(run_dir: Path, tmp_path: Path) -> None:
    sock_path = Path("/tmp") / f"perfscope-out-{os.getpid()}.sock"  # short: AF_UNIX limit
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(sock_path))
    srv.listen(1)
    got: list[bytes] = []

    def accept() -> None:
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while chunk := conn.recv(1 << 16):
                buf += chunk
            got.append(buf)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        proc = cli("export", "--format", "json", str(run_dir), "-o", str(sock_path), runs=tmp_path)
        t.join(timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
        assert json.loads(got[0])["requests"]
    finally:
        srv.close()
        sock_path.unlink(missing_ok=True)


@pytest.mark.fault(
    fault="`-o` a regular file, and `-o -`",
    before="not recorded (guard older than issue 26)",
    after="replaced whole (atomic rename); `-` writes stdout",
    kept="the whole report; no temporary file beside it",
)
def test_regular_file_is_replaced_whole_and_dash_is_stdout(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("old report")
    inode = out.stat().st_ino
    proc = cli("report", str(run_dir), "-o", str(out), runs=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().lstrip().lower().startswith("<!doctype html")
    assert out.stat().st_ino != inode, "a regular file is replaced by rename, not rewritten"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
    proc = cli("report", str(run_dir), "-o", "-", runs=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().lower().startswith("<!doctype html")
    assert proc.stdout.rstrip().endswith("</html>"), "nothing but the page on stdout"
    assert not (tmp_path / "-").exists()
