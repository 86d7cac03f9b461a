"""``perfscope hw``: list, show, detect and calibrate hardware ceilings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from perfscope._argtypes import device
from perfscope.errors import UsageError

__all__ = ["register"]


def _fmt(x: float | None, scale: float, digits: int = 1) -> str:
    return "–" if x is None else f"{x / scale:,.{digits}f}"


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
    table = Table(title=f"perfscope hardware database ({len(devices)} devices)")
    for col, just in (
        ("key", "left"),
        ("name", "left"),
        ("vendor", "left"),
        ("kind", "left"),
        ("mem GB", "right"),
        ("BW GB/s", "right"),
        ("bf16/fp16 TFLOPS", "right"),
        ("fp8 TFLOPS", "right"),
        ("fp32 TFLOPS", "right"),
        ("TDP W", "right"),
        ("ceilings", "left"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for d in devices:
        table.add_row(
            d.key,
            d.name,
            d.vendor,
            d.kind,
            _fmt(d.mem_bytes, 1e9, 0),
            _fmt(d.mem_bw_bytes_s, 1e9, 0),
            _fmt(_peak16(d), 1e12),
            _fmt(d.peak_flops.get("fp8"), 1e12),
            _fmt(d.peak_flops.get("fp32"), 1e12),
            _fmt(d.tdp_w, 1, 0),
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
    table = Table(show_lines=False)
    for col in ("field", "value", "SI", "estimate", "source", "note"):
        table.add_column(col, overflow="fold")
    for path, q in sorted(entry.quantities.items()):
        label = path + (" (sparse, not a ceiling)" if path.startswith("sparse.") else "")
        si = f"{q.si:.4g} {q.si_unit}".strip()
        table.add_row(
            label,
            f"{q.value:g} {q.unit}".strip(),
            si,
            "yes" if q.estimate else "",
            "\n".join(q.sources),
            q.note or "",
        )
    console.print(table)
    if entry.notes:
        console.print(f"notes: {entry.notes}", highlight=False)
    console.print(f"files: {', '.join(entry.files)}", highlight=False)
    return 0


def _ceilings_table(spec: Any) -> Table:
    table = Table()
    table.add_column("ceiling")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for dtype, v in sorted(spec.peak_flops.items()):
        table.add_row(f"matmul {dtype}", f"{v / 1e12:.4g}", "TFLOP/s")
    table.add_row("memory bandwidth", f"{spec.mem_bw_bytes_s / 1e9:.4g}", "GB/s")
    if spec.cache_bw_bytes_s:
        table.add_row("cache bandwidth", f"{spec.cache_bw_bytes_s / 1e9:.4g}", "GB/s")
    if spec.cache_bytes:
        table.add_row("last-level cache", f"{spec.cache_bytes / 2**20:.4g}", "MiB")
    if spec.mem_bytes:
        table.add_row("memory", f"{spec.mem_bytes / 1e9:.4g}", "GB")
    return table


def _detect(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import detect_local_device, resolve_device, spec_to_dict

    dirs = [Path(p) for p in (args.hwdb_dir or [])]
    det = detect_local_device(dirs or None)
    spec = None
    if not args.no_calibrate or det.spec is not None:
        spec = resolve_device(None, user_dirs=dirs or None, quick=True)
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
    return 0


def _calibrate(args: argparse.Namespace, console: Console) -> int:
    from perfscope.hwdb import calibrate, detect_local_device

    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    result = calibrate(args.device, quick=args.quick, cache_dir=cache_dir, force=args.force)
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
                f"{k} {v / 1e12:.4g} TFLOP/s" for k, v in sorted(datasheet.peak_flops.items())
            )
            + f", memory {datasheet.mem_bw_bytes_s / 1e9:.4g} GB/s",
            highlight=False,
        )
    fp = result.fingerprint
    console.print(
        f"machine: {fp.get('cpu_model')}, {fp.get('cores')} cores, torch "
        f"{fp.get('torch_version')} with {result.details.get('torch_threads')} threads",
        highlight=False,
    )
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``perfscope hw {list,show,detect,calibrate}``."""
    hw = subparsers.add_parser("hw", help="hardware database: list, show, detect, calibrate")
    sub = hw.add_subparsers(dest="hw_command", required=True)

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
    p.set_defaults(handler=_calibrate)
