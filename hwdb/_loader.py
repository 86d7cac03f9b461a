"""Loading the bundled device files and user overlays into a :class:`HardwareDatabase`."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfscope.errors import HardwareDatabaseError, UnknownDeviceError
from perfscope.hwdb._lookup import NameIndex
from perfscope.hwdb._schema import DeviceFileError, Entry, entry_from_document, entry_to_spec
from perfscope.hwdb.spec import DeviceSpec

__all__ = [
    "BUILTIN_DIR",
    "ENV_HWDB",
    "HardwareDatabase",
    "env_user_dirs",
    "load_database",
]

#: directory of the bundled device files.
BUILTIN_DIR = Path(__file__).resolve().parent / "devices"
#: environment variable naming user overlay directories (``os.pathsep``-separated).
ENV_HWDB = "PERFSCOPE_HWDB"


@dataclass
class HardwareDatabase:
    """All devices that loaded, and the files that did not.

    Attributes:
        devices: key → spec, in SI units.
        errors: one error per file that failed to load (malformed, incomplete, conflicting);
            the rest of the database is usable.
        entries: key → validated entry (fields with their datasheet units and sources).
        user_dirs: overlay directories that were read, in precedence order (last wins).
    """

    devices: dict[str, DeviceSpec] = field(default_factory=dict)
    errors: list[HardwareDatabaseError] = field(default_factory=list)
    entries: dict[str, Entry] = field(default_factory=dict)
    user_dirs: list[Path] = field(default_factory=list)
    _index: NameIndex = field(default_factory=NameIndex, repr=False)

    def find(self, name: str) -> DeviceSpec | None:
        """The device ``name`` (key, alias, display or raw driver name) denotes, or ``None``."""
        key = self._index.find(name)
        return self.devices.get(key) if key is not None else None

    def lookup(self, name: str) -> DeviceSpec:
        """Like :meth:`find` but raises :class:`UnknownDeviceError` with the nearest keys."""
        spec = self.find(name)
        if spec is not None:
            return spec
        suggestions = self._index.suggest(name)
        hint = f"; did you mean: {', '.join(suggestions)}?" if suggestions else ""
        raise UnknownDeviceError(
            f"unknown device {name!r}{hint} (`perfscope hw list` shows every key; add your "
            "own device with a TOML file in --hwdb-dir or $PERFSCOPE_HWDB)",
            suggestions=suggestions,
        )

    def suggest(self, name: str, limit: int = 5) -> list[str]:
        """Nearest keys to ``name``, best first."""
        return self._index.suggest(name, limit)

    def filter(self, *, vendor: str | None = None, kind: str | None = None) -> list[DeviceSpec]:
        """Devices sorted by vendor then key, optionally only one vendor and/or kind."""
        out = [
            d
            for d in self.devices.values()
            if (vendor is None or d.vendor == vendor.lower())
            and (kind is None or d.kind == kind.lower())
        ]
        return sorted(out, key=lambda d: (d.vendor, d.kind, d.key))


def env_user_dirs() -> list[Path]:
    """Directories named by ``$PERFSCOPE_HWDB`` (``os.pathsep``-separated)."""
    raw = os.environ.get(ENV_HWDB, "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise DeviceFileError(path, [("<file>", f"not valid TOML: {exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise DeviceFileError(path, [("<file>", f"not UTF-8 text, so not TOML: {exc}")]) from exc
    except OSError as exc:
        raise DeviceFileError(path, [("<file>", f"cannot be read: {exc}")]) from exc


class _Builder:
    def __init__(self, db: HardwareDatabase) -> None:
        self.db = db
        self.origin: dict[str, int] = {}  # key → layer index that defined it

    def _register(self, entry: Entry, path: Path) -> None:
        conflicts = self.db._index.conflicts(entry.key, entry.names())
        if conflicts:
            detail = [
                (
                    "aliases",
                    f"name {n!r} already belongs to device {other!r} ({self._file_of(other)})",
                )
                for n, other in conflicts
            ]
            raise DeviceFileError(path, detail)
        spec = entry_to_spec(entry)
        self.db._index.remove(entry.key)
        self.db._index.add(entry.key, entry.names())
        self.db.entries[entry.key] = entry
        self.db.devices[entry.key] = spec

    def _file_of(self, key: str) -> str:
        e = self.db.entries.get(key)
        return e.files[-1] if e else "?"

    def add_file(self, path: Path, layer: int, builtin: bool) -> None:
        doc = _read(path)
        key = doc.get("key")
        existing = self.db.entries.get(key) if isinstance(key, str) else None
        default_source = None if builtin else f"user file {path}"
        if existing is not None and self.origin.get(existing.key) == layer:
            raise DeviceFileError(
                path,
                [("key", f"duplicate key {existing.key!r}, also defined in {existing.files[-1]}")],
            )
        if existing is not None:
            overlay = entry_from_document(doc, path, partial=True, default_source=default_source)
            self._register(existing.merged(overlay), path)
            return
        partial_base: Entry | None = None
        extends = doc.get("extends")
        if isinstance(extends, str):
            partial_base = self.db.entries.get(extends)
            if partial_base is None:
                raise DeviceFileError(
                    path, [("extends", f"no device with key {extends!r} to extend")]
                )
        entry = entry_from_document(
            doc, path, partial=partial_base is not None, default_source=default_source
        )
        if partial_base is not None:
            base = replace(partial_base, key=entry.key, aliases=(), device_names=(), name=None)
            entry = base.merged(entry)
            missing = entry.missing_required()
            if missing:
                raise DeviceFileError(path, missing)
        self._register(entry, path)
        self.origin[entry.key] = layer


def _files(directory: Path) -> Iterable[Path]:
    return sorted(p for p in directory.glob("*.toml") if p.is_file())


def load_database(user_dirs: Sequence[Path | str] | None = None) -> HardwareDatabase:
    """Load the bundled devices, then ``$PERFSCOPE_HWDB`` directories, then ``user_dirs``.

    Later layers add devices or override fields of earlier ones (a file whose ``key`` already
    exists only needs the fields it changes). Files that fail validation or conflict are
    reported in :attr:`HardwareDatabase.errors`; everything else loads.
    """
    db = HardwareDatabase()
    builder = _Builder(db)
    layers: list[tuple[Path, bool]] = [(BUILTIN_DIR, True)]
    layers += [(p, False) for p in env_user_dirs()]
    layers += [(Path(p).expanduser(), False) for p in (user_dirs or [])]
    for layer, (directory, builtin) in enumerate(layers):
        if not builtin:
            db.user_dirs.append(directory)
            if not directory.is_dir():
                db.errors.append(
                    DeviceFileError(
                        directory, [("<file>", "hardware database directory does not exist")]
                    )
                )
                continue
        for path in _files(directory):
            try:
                builder.add_file(path, layer, builtin)
            except HardwareDatabaseError as exc:
                db.errors.append(exc)
    return db
