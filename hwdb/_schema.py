"""Schema of one device TOML file: validation, source resolution and conversion to SI.

A file is parsed into an :class:`Entry` (all values already in SI, every number carrying
its resolved source texts); entries from user overlays merge onto built-in ones; the final
entry becomes a :class:`~perfscope.hwdb.spec.DeviceSpec`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfscope.errors import HardwareDatabaseError
from perfscope.hwdb._units import DIMENSION_SI_UNIT, Dimension, to_si
from perfscope.hwdb.spec import DTYPES, CeilingSource, DeviceSpec

__all__ = [
    "KINDS",
    "PEAK_DTYPES",
    "DeviceFileError",
    "Entry",
    "Quantity",
    "entry_from_document",
    "entry_to_spec",
]

KINDS = ("gpu", "tpu", "npu", "cpu", "soc")
#: dtypes accepted under [dense]/[sparse]: the DeviceSpec ones plus fp4 (Blackwell).
PEAK_DTYPES = (*DTYPES, "fp4")
SCHEMA_VERSION = 1

_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_TOP_TEXT = ("key", "name", "vendor", "kind", "architecture", "notes", "extends")
_TOP_LISTS = ("aliases", "device_names")
_SECTIONS = (
    "memory",
    "onchip",
    "power",
    "launch",
    "interconnect",
    "dense",
    "sparse",
    "sources",
)
#: fixed quantity fields per section; ``interconnect``, ``dense`` and ``sparse`` take any
#: key of one dimension (links, dtypes). In ``interconnect`` a link key (``nvlink``,
#: ``pcie``, ``infinity_fabric``, ``ici``) is its total bidirectional bandwidth per device
#: ``<link>_latency`` the latency of one small collective over it and ``<link>_wait`` the
#: measured wait for the slowest rank at each synchronising collective (times).
_FIELDS: dict[str, dict[str, Dimension | None]] = {
    "memory": {"capacity": "bytes", "usable": "bytes", "bandwidth": "bandwidth", "type": None},
    "onchip": {
        "llc": "bytes",
        "llc_level": None,
        "llc_bandwidth": "bandwidth",
        "l2": "bytes",
        "smem_per_sm": "bytes",
        "l1_per_sm": "bytes",
        "sm_count": "count",
        "cores": "count",
    },
    "power": {"tdp": "power"},
    # host-to-device cost of launching one kernel (driver and runtime calls), a time
    "launch": {"kernel": "time"},
}
_QUANTITY_KEYS = {"value", "unit", "source", "estimate", "note"}


class DeviceFileError(HardwareDatabaseError):
    """A device file that cannot be used, with every problem found in it.

    Attributes:
        path: the file.
        problems: ``(field, what is wrong)`` pairs; ``field`` is a dotted path such as
            ``"memory.bandwidth"`` (``"<file>"`` for problems with the file as a whole).
        field: the first problem's field, for convenience.
    """

    def __init__(self, path: Path | str, problems: list[tuple[str, str]]) -> None:
        self.path = Path(path)
        self.problems = problems
        self.field = problems[0][0] if problems else "<file>"
        detail = "; ".join(f"field '{f}': {p}" for f, p in problems)
        super().__init__(f"{self.path}: {detail}")


@dataclass(frozen=True)
class Quantity:
    """One number of a device file.

    Attributes:
        path: dotted field path, e.g. ``"dense.bf16"``.
        value: the number as written in the file.
        unit: the unit as written (``""`` for counts).
        si: the value in SI base units (FLOP/s, B/s, B, W, or a plain count).
        si_unit: the SI unit's name (``"FLOP/s"``, ``"B/s"``, ``"B"``, ``"W"``, ``""``).
        sources: resolved source texts (URLs or document names).
        estimate: the file marks the value as derived or unofficial.
        note: free text from the file.
    """

    path: str
    value: float
    unit: str
    si: float
    si_unit: str
    sources: tuple[str, ...]
    estimate: bool = False
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "value": self.value,
            "unit": self.unit,
            "si": self.si,
            "si_unit": self.si_unit,
            "sources": list(self.sources),
            "estimate": self.estimate,
            "note": self.note,
        }


@dataclass(frozen=True)
class Entry:
    """A validated device file (or a built-in file with user overlays merged on top)."""

    key: str
    name: str | None
    vendor: str | None
    kind: str | None
    architecture: str | None = None
    notes: str | None = None
    aliases: tuple[str, ...] = ()
    device_names: tuple[str, ...] = ()
    texts: dict[str, str] = field(default_factory=dict)
    quantities: dict[str, Quantity] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    extends: str | None = None

    def names(self) -> tuple[str, ...]:
        """Every string that should resolve to this entry: key, display name, aliases, raw names."""
        out = [self.key]
        if self.name:
            out.append(self.name)
        out.extend(self.aliases)
        out.extend(self.device_names)
        return tuple(out)

    def merged(self, overlay: Entry) -> Entry:
        """This entry with ``overlay``'s fields on top; alias lists are united."""

        def union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(dict.fromkeys((*a, *b)))

        return replace(
            self,
            name=overlay.name or self.name,
            vendor=overlay.vendor or self.vendor,
            kind=overlay.kind or self.kind,
            architecture=overlay.architecture or self.architecture,
            notes=overlay.notes or self.notes,
            aliases=union(self.aliases, overlay.aliases),
            device_names=union(self.device_names, overlay.device_names),
            texts={**self.texts, **overlay.texts},
            quantities={**self.quantities, **overlay.quantities},
            files=(*self.files, *overlay.files),
        )

    def missing_required(self) -> list[tuple[str, str]]:
        """Problems that make the entry incomplete as a device of its own."""
        problems: list[tuple[str, str]] = []
        for name in ("name", "vendor", "kind"):
            if not getattr(self, name):
                problems.append((name, "required field is missing"))
        if "memory.bandwidth" not in self.quantities:
            problems.append(("memory.bandwidth", "required field is missing"))
        if not any(p.startswith("dense.") for p in self.quantities):
            problems.append(("dense", "at least one dense peak (e.g. dense.bf16) is required"))
        return problems


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _resolve_source(
    raw: object, sources: dict[str, str], default: str | None
) -> tuple[tuple[str, ...] | None, str | None]:
    """Return (resolved texts, problem)."""
    if raw is None:
        if default is not None:
            return (default,), None
        return None, "missing 'source' (a key of [sources], a URL or a document name)"
    if not isinstance(raw, str) or not raw.strip():
        return None, "'source' must be a non-empty string"
    parts = [p.strip() for p in raw.split("+")]
    if all(p in sources for p in parts):
        return tuple(sources[p] for p in parts), None
    if any(c in raw for c in " /:"):
        return (raw.strip(),), None  # a literal URL or document name
    unknown = [p for p in parts if p not in sources]
    return None, (
        f"unknown source key(s) {', '.join(repr(u) for u in unknown)}: define them under "
        "[sources] or give a URL or document name"
    )


def _quantity(
    path: str,
    raw: object,
    dimension: Dimension,
    sources: dict[str, str],
    default_source: str | None,
    problems: list[tuple[str, str]],
) -> Quantity | None:
    if _is_number(raw):
        raw = {"value": raw}
    if not isinstance(raw, dict):
        problems.append(
            (
                path,
                'expected a table like { value = 1.0, unit = "...", source = "..." }, '
                f"got {raw!r}",
            )
        )
        return None
    unknown = sorted(set(raw) - _QUANTITY_KEYS)
    if unknown:
        problems.append(
            (
                path,
                f"unknown key(s) {', '.join(unknown)} "
                f"(allowed: {', '.join(sorted(_QUANTITY_KEYS))})",
            )
        )
        return None
    value = raw.get("value")
    if value is None:
        problems.append((path, "missing 'value'"))
        return None
    if not _is_number(value):
        problems.append((path, f"'value' must be a number, got {value!r}"))
        return None
    if not math.isfinite(value):
        problems.append((path, f"'value' must be a finite number, got {value!r}"))
        return None
    if value <= 0:
        problems.append((path, f"'value' must be positive, got {value!r}"))
        return None
    unit = raw.get("unit", "")
    if not isinstance(unit, str):
        problems.append((path, f"'unit' must be a string, got {unit!r}"))
        return None
    if dimension != "count" and not unit:
        problems.append(
            (path, f"missing 'unit' (a {dimension} unit such as {_example_unit(dimension)})")
        )
        return None
    try:
        si = to_si(float(value), unit, dimension)
    except ValueError as exc:
        problems.append((path, str(exc)))
        return None
    if not math.isfinite(si):
        problems.append((path, f"{value!r} {unit} is too large to be a hardware figure"))
        return None
    estimate = raw.get("estimate", False)
    if not isinstance(estimate, bool):
        problems.append((path, f"'estimate' must be true or false, got {estimate!r}"))
        return None
    note = raw.get("note")
    if note is not None and not isinstance(note, str):
        problems.append((path, f"'note' must be a string, got {note!r}"))
        return None
    resolved, problem = _resolve_source(raw.get("source"), sources, default_source)
    if problem is not None or resolved is None:
        problems.append((path, problem or "bad source"))
        return None
    return Quantity(
        path=path,
        value=float(value),
        unit=unit,
        si=si,
        si_unit=DIMENSION_SI_UNIT[dimension],
        sources=resolved,
        estimate=estimate,
        note=note,
    )


def _example_unit(dimension: Dimension) -> str:
    return {
        "flops": "TFLOPS",
        "bandwidth": "GB/s",
        "bytes": "GB",
        "power": "W",
        "time": "us",
        "count": "",
    }[dimension]


def entry_from_document(
    doc: dict[str, Any],
    path: Path,
    *,
    partial: bool = False,
    default_source: str | None = None,
) -> Entry:
    """Validate one parsed TOML document.

    Args:
        doc: the parsed file.
        path: the file, for messages.
        partial: the file overrides fields of an existing device, so only ``key`` is required.
        default_source: source text for numbers that name none (user files); ``None`` makes
            ``source`` mandatory, as for built-in files.

    Raises:
        DeviceFileError: with every problem found.
    """
    problems: list[tuple[str, str]] = []
    allowed_top = {*(_TOP_TEXT), *_TOP_LISTS, *_SECTIONS, "schema"}
    for k in sorted(set(doc) - allowed_top):
        problems.append((k, f"unknown field (allowed: {', '.join(sorted(allowed_top))})"))

    schema = doc.get("schema", SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        problems.append(
            (
                "schema",
                f"unsupported schema version {schema!r} (this perfscope reads {SCHEMA_VERSION})",
            )
        )

    texts: dict[str, str | None] = {}
    for k in _TOP_TEXT:
        v = doc.get(k)
        if v is not None and (not isinstance(v, str) or not v.strip()):
            problems.append((k, f"must be a non-empty string, got {v!r}"))
            v = None
        texts[k] = v.strip() if isinstance(v, str) else None
    key = texts["key"]
    if key is None:
        if "key" not in {f for f, _ in problems}:
            problems.append(("key", "required field is missing"))
    elif not _KEY_RE.match(key):
        problems.append(("key", f"{key!r} must be lowercase letters, digits, '.', '_' or '-'"))
    if texts["kind"] is not None and texts["kind"] not in KINDS:
        problems.append(("kind", f"{texts['kind']!r} is not one of {', '.join(KINDS)}"))
    if texts["vendor"] is not None:
        texts["vendor"] = texts["vendor"].lower()

    lists: dict[str, tuple[str, ...]] = {}
    for k in _TOP_LISTS:
        v = doc.get(k, [])
        if not isinstance(v, list) or not all(isinstance(s, str) and s.strip() for s in v):
            problems.append((k, f"must be a list of non-empty strings, got {v!r}"))
            v = []
        lists[k] = tuple(dict.fromkeys(s.strip() for s in v))

    sources_raw = doc.get("sources", {})
    sources: dict[str, str] = {}
    if not isinstance(sources_raw, dict):
        problems.append(("sources", 'must be a table of key = "URL or document"'))
    else:
        for sk, sv in sources_raw.items():
            if not isinstance(sv, str) or not sv.strip():
                problems.append(
                    (f"sources.{sk}", "must be a non-empty string (URL or document name)")
                )
            else:
                sources[sk] = sv.strip()

    quantities: dict[str, Quantity] = {}
    section_texts: dict[str, str] = {}
    for section in ("memory", "onchip", "power", "launch", "interconnect", "dense", "sparse"):
        body = doc.get(section)
        if body is None:
            continue
        if not isinstance(body, dict):
            problems.append((section, f"must be a table, got {body!r}"))
            continue
        for name, raw in body.items():
            path_ = f"{section}.{name}"
            dimension: Dimension | None
            if section in _FIELDS:
                if name not in _FIELDS[section]:
                    allowed = ", ".join(_FIELDS[section])
                    problems.append((path_, f"unknown field (allowed in [{section}]: {allowed})"))
                    continue
                dimension = _FIELDS[section][name]
            elif section == "interconnect":
                dimension = "time" if name.endswith(("_latency", "_wait")) else "bandwidth"
            else:
                if name not in PEAK_DTYPES:
                    problems.append((path_, f"unknown dtype (allowed: {', '.join(PEAK_DTYPES)})"))
                    continue
                dimension = "flops"
            if dimension is None:
                if not isinstance(raw, str) or not raw.strip():
                    problems.append((path_, f"must be a non-empty string, got {raw!r}"))
                else:
                    section_texts[path_] = raw.strip()
                continue
            q = _quantity(path_, raw, dimension, sources, default_source, problems)
            if q is not None:
                quantities[path_] = q

    entry = Entry(
        key=key or "",
        name=texts["name"],
        vendor=texts["vendor"],
        kind=texts["kind"],
        architecture=texts["architecture"],
        notes=texts["notes"],
        aliases=lists["aliases"],
        device_names=lists["device_names"],
        texts=section_texts,
        quantities=quantities,
        files=(str(path),),
        extends=texts["extends"],
    )
    if not partial and not problems:
        problems.extend(entry.missing_required())
    if problems:
        raise DeviceFileError(path, problems)
    return entry


def _ceiling_source(entry: Entry) -> CeilingSource:
    used = [entry.quantities.get("memory.bandwidth")]
    used += [entry.quantities.get(f"dense.{d}") for d in ("fp32", "fp16", "bf16")]
    return "estimate" if any(q is not None and q.estimate for q in used) else "datasheet"


def entry_to_spec(entry: Entry) -> DeviceSpec:
    """The :class:`DeviceSpec` of a complete entry (SI units; details in ``extra``)."""
    q = entry.quantities

    def si(path: str) -> float | None:
        item = q.get(path)
        return item.si if item is not None else None

    def group(prefix: str) -> dict[str, float]:
        return {p.split(".", 1)[1]: v.si for p, v in q.items() if p.startswith(prefix + ".")}

    extra: dict[str, Any] = {
        "architecture": entry.architecture,
        "notes": entry.notes,
        "memory_type": entry.texts.get("memory.type"),
        "llc_level": entry.texts.get("onchip.llc_level"),
        "device_names": list(entry.device_names),
        "sparse_peak_flops": group("sparse"),
        "interconnect_bytes_s": {
            k: v for k, v in group("interconnect").items() if not k.endswith(("_latency", "_wait"))
        },
        "sm_count": si("onchip.sm_count"),
        "cores": si("onchip.cores"),
        "smem_per_sm_bytes": si("onchip.smem_per_sm"),
        "l1_per_sm_bytes": si("onchip.l1_per_sm"),
        "l2_bytes": si("onchip.l2"),
        "estimated_fields": sorted(p for p, v in q.items() if v.estimate),
        "fields": {p: v.to_dict() for p, v in sorted(q.items())},
        "files": list(entry.files),
    }
    bw = si("memory.bandwidth")
    assert bw is not None
    assert entry.name
    assert entry.vendor
    assert entry.kind
    return DeviceSpec(
        key=entry.key,
        name=entry.name,
        vendor=entry.vendor,
        kind=entry.kind,
        peak_flops=group("dense"),
        mem_bw_bytes_s=bw,
        mem_bytes=si("memory.capacity"),
        cache_bytes=si("onchip.llc"),
        cache_bw_bytes_s=si("onchip.llc_bandwidth"),
        tdp_w=si("power.tdp"),
        mem_usable_bytes=si("memory.usable"),
        kernel_launch_s=si("launch.kernel"),
        interconnect_bytes_s={
            k: v for k, v in group("interconnect").items() if not k.endswith(("_latency", "_wait"))
        },
        collective_latency_s={
            k.removesuffix("_latency"): v
            for k, v in group("interconnect").items()
            if k.endswith("_latency")
        },
        collective_wait_s={
            k.removesuffix("_wait"): v
            for k, v in group("interconnect").items()
            if k.endswith("_wait")
        },
        source=_ceiling_source(entry),
        aliases=tuple(dict.fromkeys((*entry.aliases, *entry.device_names))),
        extra=extra,
    )
