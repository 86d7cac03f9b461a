"""``perfscope hw``: list, show, detect and calibrate hardware ceilings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from perfscope.analysis.catalogue import NA, format_bytes, format_number, format_seconds, format_si
from perfscope.cli._argtypes import device
from perfscope.dashboard.terminal import FitTable
from perfscope.errors import PerfscopeError, UsageError

__all__ = ["register"]


def _na(text: str) -> str:
    return "–" if text == NA else text


def _db(args: argparse.Namespace) -> Any:
    from perfscope.hwdb import load_database

    dirs = [Path(p) for p in (args.hwdb_dir or [])]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"--hwdb-dir {d}: no such directory")
    return load_database(dirs)


def _warn_errors(db: Any, console: Console) -> None:
    for err in db.errors:
        console.print(f"[yellow]warning:[/] skipped {err}", markup=True, highlight=False)


def _peak16(spec: Any) -> float | None:
    p: dict[str, float] = spec.peak_flops
    return p.get("bf16") or p.get("fp16")


def _list(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import spec_to_dict

    db = _db(args)
    devices = db.filter(vendor=args.vendor, kind=args.kind)
    if args.json:
        print(
            json.dumps(
                {
                    "devices": [spec_to_dict(d) for d in devices],
                    "errors": [str(e) for e in db.errors],
                },
                indent=2,
            )
        )
        return 0
    cols: tuple[str, ...] = ("key", "name", "vendor", "kind", "memory", "bandwidth")
    cols += ("bf16/fp16", "fp8", "fp32", "TDP", "ceilings")
    table = FitTable(
        cols,
        title=f"perfscope hardware database ({len(devices)} devices)",
        right=frozenset(("memory", "bandwidth", "bf16/fp16", "fp8", "fp32", "TDP")),
        wrap=frozenset(("name",)),
        caption="peak dense matmul FLOP/s per dtype; bandwidth of device memory",
    )
    for d in devices:
        table.add_row(
            d.key,
            d.name,
            d.vendor,
            d.kind,
            _na(format_bytes(d.mem_bytes)),
            _na(format_si(d.mem_bw_bytes_s, "B/s")),
            _na(format_si(_peak16(d), "FLOP/s")),
            _na(format_si(d.peak_flops.get("fp8"), "FLOP/s")),
            _na(format_si(d.peak_flops.get("fp32"), "FLOP/s")),
            _na(format_si(d.tdp_w, "W")),
            d.source,
        )
    console.print(table)
    _warn_errors(db, console)
    return 0


def _show(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import spec_to_dict

    db = _db(args)
    spec = db.lookup(args.device)
    entry = db.entries[spec.key]
    if args.json:
        print(json.dumps(spec_to_dict(spec), indent=2))
        return 0
    console.print(
        f"[bold]{spec.name}[/]  key={spec.key}  vendor={spec.vendor}  kind={spec.kind}  "
        f"ceilings={spec.source}",
        highlight=False,
    )
    if spec.extra.get("architecture"):
        console.print(f"architecture: {spec.extra['architecture']}", highlight=False)
    console.print(f"aliases: {', '.join(entry.aliases) or '–'}", highlight=False)
    console.print(f"raw device names: {', '.join(entry.device_names) or '–'}", highlight=False)
    for label, path in (("memory type", "memory.type"), ("last-level cache", "onchip.llc_level")):
        if path in entry.texts:
            console.print(f"{label}: {entry.texts[path]}", highlight=False)
    table = FitTable(
        ("field", "value", "SI", "estimate", "source"),
        right=frozenset(("value", "SI")),
        wrap=frozenset(("source",)),
    )
    # A source shared by many fields is printed once, below, as a numbered reference.
    refs: dict[str, int] = {}
    for path, q in sorted(entry.quantities.items()):
        label = path + (" (sparse, not a ceiling)" if path.startswith("sparse.") else "")
        marks = []
        for src in q.sources:
            marks.append(f"[{refs.setdefault(src, len(refs) + 1)}]")
        table.add_row(
            label,
            f"{format_number(q.value, 4)} {q.unit}".strip(),
            _na(format_seconds(q.si) if q.si_unit == "s" else format_si(q.si, q.si_unit, 4)),
            "yes" if q.estimate else "",
            " ".join(marks) + (f" {q.note}" if q.note else ""),
        )
    console.print(table)
    for src, n in refs.items():
        console.print(Text(f"[{n}] {src}"), highlight=False)
    if entry.notes:
        console.print(f"notes: {entry.notes}", highlight=False)
    console.print(f"files: {', '.join(entry.files)}", highlight=False)
    return 0


def _ceilings_table(spec: Any) -> FitTable:
    table = FitTable(("ceiling", "value"), right=frozenset(("value",)))
    for dtype, v in sorted(spec.peak_flops.items()):
        table.add_row(f"matmul {dtype}", format_si(v, "FLOP/s", 4))
    table.add_row("memory bandwidth", format_si(spec.mem_bw_bytes_s, "B/s", 4))
    if spec.cache_bw_bytes_s:
        table.add_row("cache bandwidth", format_si(spec.cache_bw_bytes_s, "B/s", 4))
    if spec.cache_bytes:
        table.add_row("last-level cache", format_bytes(spec.cache_bytes))
    if spec.mem_bytes:
        table.add_row("memory", format_bytes(spec.mem_bytes))
    return table


def _detect(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import detect_local_device, resolve_device, spec_to_dict

    dirs = [Path(p) for p in (args.hwdb_dir or [])]
    det = detect_local_device(dirs or None)
    spec = None
    if not args.no_calibrate or det.spec is not None:
        spec = resolve_device(None, user_dirs=dirs or None, quick=True)
    else:
        # No measuring, but the cached calibration is what runs use: show it when present.
        try:
            spec = resolve_device(None, user_dirs=dirs or None, calibrate_if_unknown=False)
        except PerfscopeError:
            spec = None
    if args.json:
        print(
            json.dumps(
                {
                    "name": det.name,
                    "kind": det.kind,
                    "source": det.source,
                    "count": det.count,
                    "mem_bytes": det.mem_bytes,
                    "cores": det.cores,
                    "llc_bytes": det.llc_bytes,
                    "known_key": det.spec.key if det.spec else None,
                    "ceilings": spec_to_dict(spec) if spec else None,
                },
                indent=2,
            )
        )
        return 0
    console.print(
        f"detected {det.kind}: [bold]{det.name}[/] (from {det.source}"
        f"{f', {det.count} devices' if det.count > 1 else ''})",
        highlight=False,
    )
    if det.cores:
        console.print(f"logical cores: {det.cores}", highlight=False)
    console.print(f"database entry: {det.spec.key if det.spec else 'none'}", highlight=False)
    if spec is not None:
        cal = spec.extra.get("calibration")
        title = f"{spec.name} — ceilings: {spec.source}"
        if cal:
            cached = "cached, " if cal["from_cache"] else ""
            title += f" ({cached}measured {cal['created_at']} in {cal['seconds']:.1f} s)"
        console.print(title, highlight=False)
        console.print(_ceilings_table(spec))
    elif args.no_calibrate:
        console.print(
            "no cached calibration: runs will measure one (or run `perfscope hw calibrate`)",
            highlight=False,
        )
    return 0


def _calibrate(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import calibrate, detect_local_device
    from perfscope.hwdb.calibrate import provisional_note

    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    result = calibrate(
        args.device,
        quick=args.quick,
        cache_dir=cache_dir,
        force=args.force,
        refuse_contended=args.refuse_contended,
    )
    spec = result.to_device_spec()
    datasheet = None
    if args.device != "cpu":
        datasheet = detect_local_device().spec
    if args.json:
        out = result.to_dict()
        if datasheet is not None:
            out["datasheet"] = {
                "key": datasheet.key,
                "peak_flops": datasheet.peak_flops,
                "mem_bw_bytes_s": datasheet.mem_bw_bytes_s,
            }
        print(json.dumps(out, indent=2))
        return 0
    how = "read from cache" if result.from_cache else "measured"
    title = (
        f"{result.device_name} — calibrated ({'quick' if result.quick else 'full'}, {how}; "
        f"measured {result.created_at} in {result.seconds:.1f} s)"
    )
    console.print(title, highlight=False)
    console.print(_ceilings_table(spec))
    if datasheet is not None:
        console.print(
            f"datasheet ({datasheet.key}): "
            + ", ".join(
                f"{k} {format_si(v, 'FLOP/s', 4)}" for k, v in sorted(datasheet.peak_flops.items())
            )
            + f", memory {format_si(datasheet.mem_bw_bytes_s, 'B/s', 4)}",
            highlight=False,
        )
    note = provisional_note(spec.extra)
    if note:
        console.print(f"[bold yellow]⚠ {note}[/]", highlight=False)
    fp = result.fingerprint
    console.print(
        f"machine: {fp.get('cpu_model')}, {fp.get('cores')} cores, torch "
        f"{fp.get('torch_version')} with {result.details.get('torch_threads')} threads",
        highlight=False,
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope hw {list,show,detect,calibrate}``."""
    hw = subparsers.add_parser(
        "hw",
        help="hardware database: list, show, detect, calibrate",
        description="The hardware database and this machine's ceilings.",
    )
    sub = hw.add_subparsers(dest="hw_command", metavar="COMMAND")

    def bare(args: argparse.Namespace, console: Console) -> int:
        hw.print_help()
        return 0

    hw.set_defaults(handler=bare)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print JSON to stdout")
        p.add_argument(
            "--hwdb-dir",
            action="append",
            metavar="DIR",
            help="directory of user device TOML files (repeatable; also $PERFSCOPE_HWDB)",
        )

    p = sub.add_parser("list", help="table of known devices")
    common(p)
    p.add_argument("--vendor", help="only this vendor (nvidia, amd, google, intel, apple)")
    p.add_argument("--kind", choices=("gpu", "tpu", "npu", "cpu", "soc"), help="only this kind")
    p.set_defaults(handler=_list)

    p = sub.add_parser("show", help="every field of one device with its source")
    common(p)
    p.add_argument("device", help='key, alias or raw name such as "NVIDIA A100-SXM4-80GB"')
    p.set_defaults(handler=_show)

    p = sub.add_parser(
        "detect", help="detect the local device and show the ceilings perfscope uses"
    )
    common(p)
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="do not measure a CPU/unknown device (show the cached calibration only)",
    )
    p.set_defaults(handler=_detect)

    p = sub.add_parser("calibrate", help="measure matmul peaks and memory/cache bandwidth here")
    p.add_argument("--json", action="store_true", help="print JSON to stdout")
    p.add_argument("--quick", action="store_true", help="short run (fp32 and bf16; a few seconds)")
    p.add_argument("--force", action="store_true", help="measure even if a cached result exists")
    p.add_argument("--device", type=device, default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument(
        "--cache-dir", help="cache root (default $PERFSCOPE_CACHE_DIR or ~/.cache/perfscope)"
    )
    p.add_argument(
        "--refuse-contended",
        action="store_true",
        help="fail instead of keeping provisional ceilings when other processes keep the "
        "machine busy through every attempt",
    )
    p.set_defaults(handler=_calibrate)
