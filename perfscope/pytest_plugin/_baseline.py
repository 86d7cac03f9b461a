"""Saved baselines for the pytest regression gate.

``pytest --perfscope-save NAME`` stores each perf test's key metrics (medians and the
per-repeat samples) with the machine (hardware key, CPU/GPU, versions) and the commit in
``<storage>/NAME.json``; ``--perfscope-compare NAME`` judges every metric against it:
lower is better for latency and energy, higher for throughput and utilisation, and a
metric regresses when it got worse by more than its tolerance and, with enough repeats on
both sides to detect a change (4+), by more than the run-to-run noise, judged by the rule
every comparison uses (:mod:`perfscope.analysis.experiment`, ``docs/experiments.md``).
Every comparison shows the noise band it used (``noise ±x%``, or ``noise unknown`` with
too few repeats, where only the tolerance gates). Baselines from other hardware are
refused unless forced: timings do not carry across machines. :func:`contention_lines` says
which runs were measured while other processes competed for the CPU.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from perfscope.analysis.catalogue import format_change, format_metric, format_ratio
from perfscope.analysis.compare import contention_of
from perfscope.analysis.experiment import BETTER, WORSE
from perfscope.analysis.summary import Record
from perfscope.checks.change import compare_samples
from perfscope.checks.grammar import parse_limit, parse_tolerance
from perfscope.errors import BrokenRunError, SLOError, UsageError
from perfscope.jsontypes import JsonObject
from perfscope.profiler.store import read_json_capped, write_json_atomic

__all__ = [
    "BASELINE_SCHEMA",
    "DEFAULT_TOLERANCE",
    "Baseline",
    "BaselineTest",
    "CommitInfo",
    "KeyMetric",
    "MachineInfo",
    "MetricComparison",
    "Tolerance",
    "baseline_path",
    "commit_info",
    "compare_metrics",
    "contention_lines",
    "hardware_mismatch",
    "load_baseline",
    "machine_info",
    "parse_fail_option",
    "save_baseline",
]

BASELINE_SCHEMA = "perfscope.baseline/1"
#: Relative tolerance of every metric when ``--perfscope-fail`` names none.
DEFAULT_TOLERANCE = 0.10
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class MachineInfo(Record):
    """Facts about the machine a baseline (or a session) was measured on.

    ``hardware_key`` decides whether timings are comparable (``gpu:h100-sxm5-80gb x2``,
    ``cpu:<model> (16 cores)``); ``device`` and ``device_kind`` name its device; then the
    CPU model and logical cores, the GPUs' names, the platform, host and the versions of
    Python, perfscope, torch and pytest (``None`` when not installed).
    """

    hardware_key: str | None = None
    device: str | None = None
    device_kind: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    gpus: tuple[str, ...] = ()
    platform: str | None = None
    hostname: str | None = None
    python: str | None = None
    perfscope: str | None = None
    torch: str | None = None
    pytest: str | None = None


@dataclass(frozen=True, kw_only=True)
class CommitInfo(Record):
    """The git commit measured: ``id`` (``None`` outside git), ``branch``, ``dirty``."""

    id: str | None = None
    branch: str | None = None
    dirty: bool | None = None


@dataclass(frozen=True, kw_only=True)
class KeyMetric(Record):
    """One metric of a perf test's run (or run set): its summary ``path``, ``value`` (the
    median over the repeats, SI units), the per-repeat ``samples``, its unit ``kind`` and
    better ``direction`` (``lower``/``higher``; ``None``: reported, never gated)."""

    path: str | None = None
    value: float | None = None
    samples: tuple[float, ...] = ()
    kind: str | None = None
    direction: str | None = None


@dataclass(frozen=True, kw_only=True)
class BaselineTest(Record):
    """One measurement saved in a baseline: the test's node id, the measurement's label,
    the test's outcome, its run directories and its key metrics."""

    nodeid: str = ""
    label: str = ""
    outcome: str = ""
    run_dirs: tuple[str, ...] = ()
    metrics: dict[str, KeyMetric] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Baseline(Record):
    """A saved baseline (``<storage>/NAME.json``, schema :data:`BASELINE_SCHEMA`): its name,
    when it was written (ISO 8601), the machine and commit, and the measurements by key."""

    schema: str = BASELINE_SCHEMA
    name: str | None = None
    created_at: str | None = None
    machine: MachineInfo | None = None
    commit: CommitInfo | None = None
    tests: dict[str, BaselineTest] = field(default_factory=dict)

    @property
    def hardware_key(self) -> str | None:
        """The machine's hardware key (``None`` when the baseline records no machine)."""
        return self.machine.hardware_key if self.machine is not None else None


# --------------------------------------------------------------------------- machine


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_names() -> list[str]:
    torch = sys.modules.get("torch")  # never import torch just for this
    try:
        if torch is not None and torch.cuda.is_available():
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return []


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> MachineInfo:
    """Facts about this machine; ``hardware_key`` decides whether timings are comparable.

    The key comes from :func:`perfscope.hwdb.detect_local_device` (the first GPU by its
    database key or name and the GPU count, else the CPU model and its logical cores);
    without the hardware database, from ``/proc/cpuinfo`` and torch's CUDA device name.
    """
    from perfscope import __version__

    info = MachineInfo(
        cpu=_cpu_name(),
        cpu_count=os.cpu_count(),
        gpus=tuple(_gpu_names()),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        python=platform.python_version(),
        perfscope=__version__,
        torch=_version("torch"),
        pytest=_version("pytest"),
    )
    try:
        from perfscope.hwdb import detect_local_device

        dev = detect_local_device()
    except Exception:  # the database is optional here: fall back to plain names
        dev = None
    if dev is not None:
        ident = dev.spec.key if dev.spec is not None else dev.name
        key = f"{dev.kind}:{ident}"
        if dev.kind == "gpu" and dev.count > 1:
            key += f" x{dev.count}"
        if dev.kind == "cpu" and dev.cores:
            key += f" ({dev.cores} cores)"
        return replace(info, hardware_key=key, device=dev.name, device_kind=dev.kind)
    if info.gpus:
        n = len(info.gpus)
        key = f"gpu:{info.gpus[0]}" + (f" x{n}" if n > 1 else "")
        return replace(info, hardware_key=key, device=info.gpus[0], device_kind="gpu")
    key = f"cpu:{info.cpu} ({info.cpu_count} cores)"
    return replace(info, hardware_key=key, device=info.cpu, device_kind="cpu")


def _git(root: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def commit_info(root: Path) -> CommitInfo:
    """The git commit of ``root`` (``id``, ``branch``, ``dirty``); ``id`` None outside git."""
    sha = _git(root, "rev-parse", "HEAD")
    if sha is None:
        return CommitInfo()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return CommitInfo(
        id=sha,
        branch=_git(root, "rev-parse", "--abbrev-ref", "HEAD"),
        dirty=bool(status) if status is not None else None,
    )


# --------------------------------------------------------------------------- storage


def baseline_path(storage: Path, name: str) -> Path:
    """``storage/NAME.json``; a NAME ending in ``.json`` or holding a ``/`` is a path."""
    if name.endswith(".json") or "/" in name or os.sep in name:
        return Path(name)
    if not _NAME_RE.match(name):
        raise UsageError(
            f"baseline name {name!r}: use letters, digits, '.', '_' and '-' (e.g. main), "
            "or a path ending in .json"
        )
    return storage / f"{name}.json"


def load_baseline(path: Path) -> Baseline:
    """Read a saved baseline; UsageError when missing or not a perfscope baseline."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"no perfscope baseline at {path}: create it first with "
            f"--perfscope-save {path.stem} (on this machine)"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read perfscope baseline {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA:
        raise UsageError(f"{path} is not a perfscope baseline (schema {BASELINE_SCHEMA})")
    problem = _shape_problem(data)
    if problem:
        raise UsageError(
            f"baseline {path} is damaged: {problem}; save it again with "
            f"--perfscope-save {path.stem}"
        )
    return Baseline.from_dict(data)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _shape_problem(data: Mapping[str, Any]) -> str | None:
    """What is wrong-typed in a parsed baseline (``None`` when its shape is right)."""
    for key in ("machine", "commit"):
        if key in data and data[key] is not None and not isinstance(data[key], dict):
            return f"'{key}' should be an object, got {type(data[key]).__name__}"
    tests = data.get("tests", {})
    if not isinstance(tests, dict):
        return f"'tests' should be an object, got {type(tests).__name__}"
    for tkey, test in tests.items():
        if not isinstance(test, dict):
            return f"tests[{tkey!r}] should be an object, got {type(test).__name__}"
        metrics = test.get("metrics", {})
        if not isinstance(metrics, dict):
            return f"tests[{tkey!r}].metrics should be an object, got {type(metrics).__name__}"
        for mname, m in metrics.items():
            where = f"tests[{tkey!r}].metrics[{mname!r}]"
            if not isinstance(m, dict):
                return f"{where} should be an object, got {type(m).__name__}"
            if m.get("value") is not None and not _is_number(m["value"]):
                return f"{where}.value should be a number, got {m['value']!r}"
            samples = m.get("samples")
            if samples is not None and (
                not isinstance(samples, list) or not all(_is_number(x) for x in samples)
            ):
                return f"{where}.samples should be a list of numbers"
            for name in ("path", "direction"):
                if m.get(name) is not None and not isinstance(m[name], str):
                    return f"{where}.{name} should be text, got {m[name]!r}"
    return None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path + '.lock'`` (POSIX ``flock``; no lock elsewhere), so
    concurrent saves to one baseline read, merge and write one after another."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic write still keeps the file whole
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def save_baseline(
    path: Path,
    *,
    name: str,
    machine: MachineInfo,
    commit: CommitInfo,
    tests: Mapping[str, BaselineTest],
) -> tuple[Baseline, str]:
    """Write (or update) the baseline at ``path``; returns it and a one-line note.

    Tests already in a baseline from the same hardware and not run now are kept; a
    baseline from other hardware is replaced. The read, merge and write happen under a
    lock, so pytest processes saving one baseline at once never lose each other's tests."""
    with _locked(path):
        return _save_unlocked(path, name=name, machine=machine, commit=commit, tests=tests)


def _save_unlocked(
    path: Path,
    *,
    name: str,
    machine: MachineInfo,
    commit: CommitInfo,
    tests: Mapping[str, BaselineTest],
) -> tuple[Baseline, str]:
    note = "created"
    merged: dict[str, BaselineTest] = {}
    if path.exists():
        try:
            old = load_baseline(path)
        except UsageError:
            old = None
        if old is not None and old.hardware_key == machine.hardware_key:
            merged = dict(old.tests)
            note = "updated"
        else:
            note = "replaced (it came from other hardware)"
    merged.update(tests)
    data = Baseline(
        name=name,
        created_at=datetime.now(UTC).isoformat(),
        machine=machine,
        commit=commit,
        tests=merged,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data.to_dict())
    return data, note


def hardware_mismatch(baseline: Baseline, machine: MachineInfo) -> str | None:
    """Why the baseline's timings do not apply here, or ``None`` when they do."""
    then = baseline.hardware_key
    now = machine.hardware_key
    if then == now:
        return None
    return (
        f"baseline {baseline.name!r} was recorded on {then} but this machine is {now}; "
        "timings do not compare across hardware. Save a baseline here "
        f"(--perfscope-save {baseline.name}) or pass --perfscope-force to compare anyway"
    )


# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tolerance:
    """How much worse a metric may get: ``relative`` (0.1 = 10%) or ``absolute`` (SI).

    ``metric`` is a metric name (``ttft.p99``), a full summary path or ``*`` for all."""

    metric: str
    relative: float | None
    absolute: float | None
    text: str

    def matches(self, name: str, path: str | None) -> bool:
        if self.metric == "*":
            return True
        return self.metric in (name, path) or bool(path and path.endswith("." + self.metric))

    def as_relative(self, base: float) -> float:
        if self.relative is not None:
            return self.relative
        assert self.absolute is not None
        return self.absolute / abs(base) if base else 0.0


def parse_fail_option(text: str) -> Tolerance:
    """``ttft.p99:10%``, ``throughput.output_tok_s:5%``, ``ttft.p99:20ms``, ``*:15%``."""
    metric, sep, limit = text.rpartition(":")
    metric, limit = metric.strip(), limit.strip()
    if not sep or not metric or not limit:
        raise SLOError(
            f"cannot read {text!r}: write METRIC:TOLERANCE, e.g. ttft.p99:10% or "
            "throughput.output_tok_s:5% (or *:10% for every metric)"
        )
    if limit.endswith("%"):
        return Tolerance(metric, parse_tolerance(limit), None, limit)
    absolute = parse_limit(limit, None if metric == "*" else metric, context=text)
    if absolute < 0:
        raise SLOError(f"tolerance in {text!r} must not be negative")
    return Tolerance(metric, None, absolute, limit)


def _pick_tolerance(name: str, path: str | None, tolerances: list[Tolerance]) -> Tolerance | None:
    specific = [t for t in tolerances if t.metric != "*" and t.matches(name, path)]
    if specific:
        return specific[-1]
    wildcard = [t for t in tolerances if t.metric == "*"]
    return wildcard[-1] if wildcard else None


# --------------------------------------------------------------------------- comparison


@dataclass
class MetricComparison:
    """One metric of one test against the baseline.

    Attributes:
        key: the test's baseline key.
        metric: the metric name; ``path`` its summary path.
        current, baseline: medians (SI units); ``None`` where absent.
        change: relative change (``None`` when not computable).
        tolerance: the tolerance text applied (``None``: not gated).
        verdict: ``ok``, ``regressed``, ``improved``, ``within noise``, ``info`` (not
            gated or no better direction), ``new`` (no baseline value).
        noise: half-width of the 95% run-to-run noise band as a fraction of the baseline
            (``None`` without repeats on both sides: noise unknown).
        detectable: the smallest change (fraction) the repeats could detect (``None``:
            too few repeats to detect any, or noise unknown).
        threshold: the tolerance as a fraction of the baseline (``None``: not gated).
        needs: repeats a side that would detect a change of ``threshold`` at this noise,
            where the comparison found none and could not have seen one that large
            (``None`` otherwise, or with the noise unknown).
    """

    key: str
    metric: str
    path: str | None
    current: float | None
    baseline: float | None
    change: float | None
    tolerance: str | None
    verdict: str
    noise: float | None = None
    detectable: float | None = None
    threshold: float | None = None
    needs: int | None = None
    repeats: int = 0

    @property
    def regressed(self) -> bool:
        return self.verdict == "regressed"

    @property
    def blind(self) -> bool:
        """Passed without a detectable change, but the repeats could not have seen a change
        as large as the tolerance: the pass is no evidence the tolerance holds."""
        if self.verdict not in ("ok", "within noise") or not self.threshold:
            return False
        if self.needs is None:
            return False
        return self.detectable is None or self.detectable > math.log1p(self.threshold)

    def blind_text(self) -> str:
        """``tpot.p50: no detectable change, but changes under ±12% are not detectable with
        3 repeats a side; seeing the 5% tolerance needs about 14`` (``""`` when not blind)."""
        if not self.blind:
            return ""
        seen = (
            f"changes under ±{format_ratio(self.detectable)} are not detectable"
            if self.detectable is not None
            else "no change is detectable"
        )
        return (
            f"{self.metric}: no detectable change, but {seen} with {self.repeats} repeats a "
            f"side; seeing the {format_ratio(self.threshold)} tolerance needs about "
            f"{self.needs} repeats a side at this noise"
        )

    def describe(self) -> str:
        path = self.path or self.metric
        ch = "" if self.change is None else f" ({format_change(self.change)}"
        tol = f", tolerance {self.tolerance}" if self.tolerance and ch else ""
        band = (
            ""
            if not ch
            else (
                f", noise ±{format_ratio(self.noise)}"
                if self.noise is not None
                else ", noise unknown: single runs"
            )
        )
        blind = (
            f"; could not see ±{format_ratio(self.threshold)}: about {self.needs} repeats a "
            "side needed"
            if self.blind
            else ""
        )
        return (
            f"{self.metric}: {format_metric(self.current, path)} vs baseline "
            f"{format_metric(self.baseline, path)}{ch}{tol}{band}{blind}{')' if ch else ''}"
        )

    def to_dict(self) -> JsonObject:
        return {
            "metric": self.metric,
            "path": self.path,
            "current": self.current,
            "baseline": self.baseline,
            "change": self.change,
            "tolerance": self.tolerance,
            "verdict": self.verdict,
            "noise": self.noise,
            "detectable": self.detectable,
            "threshold": self.threshold,
            "needs": self.needs,
        }


def compare_metrics(
    key: str,
    current: Mapping[str, KeyMetric],
    baseline: Mapping[str, KeyMetric] | None,
    tolerances: list[Tolerance],
    *,
    gate_all: bool,
) -> list[MetricComparison]:
    """Compare one test's metrics (name → :class:`KeyMetric`) with the baseline's.

    A metric is gated by the tolerance that names it (or ``*``); with ``gate_all`` every
    metric without one is gated at :data:`DEFAULT_TOLERANCE`. A metric whose better
    direction is unknown is reported, never gated."""
    out: list[MetricComparison] = []
    for name, cur in current.items():
        path = cur.path
        base = (baseline or {}).get(name)
        value = cur.value
        if base is None or base.value is None or value is None:
            out.append(MetricComparison(key, name, path, value, None, None, None, "new"))
            continue
        tol = _pick_tolerance(name, path, tolerances)
        if tol is None and gate_all:
            tol = Tolerance("*", DEFAULT_TOLERANCE, None, format_ratio(DEFAULT_TOLERANCE))
        better = cur.direction
        b_samples = [float(v) for v in base.samples or [base.value]]
        c_samples = [float(v) for v in cur.samples or [value]]
        base_value = float(base.value)
        change = compare_samples(
            name,
            b_samples,
            c_samples,
            tolerance=tol.as_relative(base_value) if tol else 0.0,
            better=better,
        )
        noise = change.noise
        rel = (float(value) - base_value) / abs(base_value) if base_value else None
        threshold = tol.as_relative(base_value) if tol else None
        needs = change.needs(threshold) if threshold and change.spread is not None else None
        if tol is None or better is None:
            verdict = "info"
        elif change.verdict == WORSE:
            verdict = "regressed"
        elif change.verdict == BETTER:
            verdict = "improved"
        elif (
            change.detectable is None and rel is not None and abs(rel) > tol.as_relative(base_value)
        ):
            # Too few repeats to measure the noise (the test cannot detect any change):
            # only the tolerance gates, as for single runs.
            noise = None
            worse = rel > 0 if better == "lower" else rel < 0
            verdict = "regressed" if worse else "improved"
        elif rel is not None and abs(rel) > tol.as_relative(base_value):
            # Beyond the tolerance, but not beyond the run-to-run noise (or too few repeats
            # to tell): reported, never failed.
            verdict = "within noise"
        else:
            verdict = "ok"
        out.append(
            MetricComparison(
                key,
                name,
                path,
                float(value),
                base_value,
                rel,
                tol.text if tol else None,
                verdict,
                noise,
                change.detectable,
                threshold,
                needs,
                min(len(b_samples), len(c_samples)),
            )
        )
    return out


def contention_lines(run_dirs: list[str]) -> list[str]:
    """One line per run in ``run_dirs`` that was measured while other processes competed
    for the CPU (from its summary.json); unreadable runs are skipped."""
    out: list[str] = []
    for d in run_dirs:
        try:
            summary = read_json_capped(Path(d) / "summary.json")
        except (OSError, ValueError, BrokenRunError):
            continue
        c = contention_of(summary) if isinstance(summary, dict) else None
        if c and c.get("contended"):
            share = c.get("others_share")
            what = f"{share:.0%} of the CPU" if isinstance(share, float) else "the CPU"
            out.append(
                f"contention: other processes used {what} during {Path(d).name}: its timings "
                "are likely inflated"
            )
    return out
