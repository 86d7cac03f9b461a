"""Run directories: manifest.json, Parquet tables, summary.json (DESIGN.md §3).

Every file is written atomically (a temp file in the same folder, then ``os.replace``), so a
reader never sees half a file and an interrupted run still leaves readable files.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from perfscope.errors import RunNotFoundError
from perfscope.profiler.records import (
    CHUNK_SCHEMA,
    REQUEST_SCHEMA,
    STEP_SCHEMA,
    TELEMETRY_SCHEMA,
)

__all__ = [
    "DEFAULT_RUNS_DIR",
    "TABLES",
    "StoredRun",
    "default_runs_root",
    "list_runs",
    "new_run_dir",
    "read_run",
    "write_json_atomic",
    "write_table_atomic",
]

DEFAULT_RUNS_DIR = "perfscope-runs"

#: Table name → schema of the Parquet files in a run directory.
TABLES: dict[str, pa.Schema] = {
    "requests": REQUEST_SCHEMA,
    "chunks": CHUNK_SCHEMA,
    "steps": STEP_SCHEMA,
    "telemetry": TELEMETRY_SCHEMA,
}


def default_runs_root() -> Path:
    """``$PERFSCOPE_RUNS_DIR`` or ``./perfscope-runs``."""
    return Path(os.environ.get("PERFSCOPE_RUNS_DIR") or DEFAULT_RUNS_DIR)


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:40] or "run"


def new_run_dir(root: Path, name: str, started_at: datetime) -> Path:
    """Create ``root/<YYYYMMDD-HHMMSS>-<name>-<4 hex>`` and return it."""
    root.mkdir(parents=True, exist_ok=True)
    stamp = started_at.astimezone().strftime("%Y%m%d-%H%M%S")
    for _ in range(20):
        path = root / f"{stamp}-{_slug(name)}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RuntimeError(f"could not create a unique run directory under {root}")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; run files are meant to be shared
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON (NaN/inf written as null)."""
    text = json.dumps(_clean(obj), indent=2, allow_nan=False) + "\n"

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    _atomic(path, write)


def write_table_atomic(path: Path, table: pa.Table) -> None:
    def write(tmp: str) -> None:
        pq.write_table(table, tmp)

    _atomic(path, write)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats → None, numpy scalars → Python, tuples → lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, str | bytes):
        try:
            obj = obj.item()
        except (ValueError, TypeError):
            return str(obj)
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


@dataclass
class StoredRun:
    """A run directory read back. Tables that were never written are empty frames with
    the right columns."""

    path: Path
    manifest: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    steps: pd.DataFrame
    telemetry: pd.DataFrame
    summary: dict[str, Any] | None

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id", self.path.name))

    @property
    def status(self) -> str:
        return str(self.manifest.get("status", "unknown"))


def _read_table(path: Path, schema: pa.Schema) -> pd.DataFrame:
    if not path.exists():
        empty: pd.DataFrame = schema.empty_table().to_pandas()
        return empty
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise RunNotFoundError(f"cannot read {path}: {exc}") from None
    frame: pd.DataFrame = table.to_pandas()
    return frame


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of run directory ``path``; RunNotFoundError when missing or broken."""
    mpath = path / "manifest.json"
    if not path.is_dir():
        raise RunNotFoundError(f"run directory {str(path)!r} does not exist")
    if not mpath.is_file():
        raise RunNotFoundError(
            f"{str(path)!r} is not a perfscope run (no manifest.json); "
            "give a folder listed by 'perfscope ls'"
        )
    try:
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunNotFoundError(f"cannot read {mpath}: {exc}") from None
    if not isinstance(data, dict):
        raise RunNotFoundError(f"{mpath} does not hold a JSON object")
    return data


def read_run(path: Path | str, *, tables: bool = True) -> StoredRun:
    """Load a run directory; ``tables=False`` skips the Parquet files (fast listing)."""
    path = Path(path)
    manifest = read_manifest(path)
    frames = {
        name: (
            _read_table(path / f"{name}.parquet", schema)
            if tables
            else schema.empty_table().to_pandas()
        )
        for name, schema in TABLES.items()
    }
    summary: dict[str, Any] | None = None
    spath = path / "summary.json"
    if spath.is_file():
        try:
            summary = json.loads(spath.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            summary = None
    return StoredRun(path=path, manifest=manifest, summary=summary, **frames)


def resolve_run_path(ref: str | Path, root: Path | None = None) -> Path:
    """A run given as a path, a run id under ``root`` or ``latest``."""
    p = Path(ref)
    if p.is_dir():
        return p
    if p.is_absolute() or len(p.parts) > 1:
        raise RunNotFoundError(f"run directory {str(p)!r} does not exist")
    base = root or default_runs_root()
    if str(ref) == "latest":
        runs = list_runs(base)
        if not runs:
            raise RunNotFoundError(f"no runs in {str(base)!r}")
        return runs[0]
    if (base / str(ref)).is_dir():
        return base / str(ref)
    matches = [
        r for r in list_runs(base) if r.name.startswith(str(ref)) or r.name.endswith(str(ref))
    ]
    if len(matches) == 1:
        return matches[0]
    raise RunNotFoundError(
        f"run {str(ref)!r} not found (looked for a folder and for a run id in {str(base)!r}); "
        "'perfscope ls' lists runs"
    )


def list_runs(root: Path) -> list[Path]:
    """Run directories under ``root`` (those with a manifest), newest first."""
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and (p / "manifest.json").is_file()]
    return sorted(
        runs, key=lambda p: (p.name[:15], (p / "manifest.json").stat().st_mtime), reverse=True
    )


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (the same temp-file-and-replace as the run files),
    for the files perfscope writes beside runs: reports, exports, baselines."""

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    _atomic(path, write)


def write_text_atomic(path: Path, text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))
