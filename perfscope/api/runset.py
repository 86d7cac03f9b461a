"""Runs as assertion targets: a :class:`RunSet` of repeats, and the helpers that read a
summary, the individual runs and their directories from a Run, RunSet, path or dict."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from perfscope.checks.grammar import number_or_none, resolve_metric
from perfscope.errors import UsageError

__all__ = ["RunSet", "load_if_path", "run_dirs", "runs_of", "samples_of", "summary_of"]


def summary_of(target: Any) -> Mapping[str, Any]:
    if isinstance(target, Mapping):
        return target
    summary = getattr(target, "summary", None)
    to_dict = getattr(summary, "to_dict", None)
    if callable(to_dict) and not isinstance(summary, Mapping):
        # a Run's typed Summary: its summary.json form (duck-typed, so that importing the
        # pytest plugin does not load the analysis stack and pandas)
        summary = to_dict()
    if not isinstance(summary, Mapping):
        raise TypeError(
            f"expected a perfscope Run, RunSet or summary dict, got {type(target).__name__}"
        )
    return summary


def _median_tree(trees: Sequence[Any]) -> Any:
    first = trees[0]
    if isinstance(first, Mapping):
        return {
            k: _median_tree([t[k] for t in trees if isinstance(t, Mapping) and k in t])
            for k in first
        }
    nums = [t for t in trees if isinstance(t, int | float) and not isinstance(t, bool)]
    if nums and len(nums) == len(trees) and not isinstance(first, bool):
        return float(statistics.median(nums))
    return first


class RunSet:
    """The same workload run several times (``perfscope.run(..., repeat=N)``).

    Attribute access reads the *median* over the repeats of every number in the summary
    (``runs.ttft.p99``); :meth:`values` gives the per-repeat values. ``expect`` and
    ``check`` on a RunSet assert on the median or on a confidence bound.

    Attributes:
        runs: the individual :class:`perfscope.Run` objects, in order.
        summary: element-wise median of their summaries, as the typed
            :class:`~perfscope.analysis.Summary` (its summary.json form is
            ``runs.summary.to_dict()``).
    """

    def __init__(self, runs: Sequence[Any]) -> None:
        from perfscope.analysis.summary import Summary  # loads without pandas

        if not runs:
            raise UsageError("a RunSet needs at least one run")
        self.runs: list[Any] = list(runs)
        self.summary: Summary = Summary.from_dict(_median_tree([summary_of(r) for r in self.runs]))

    @property
    def path(self) -> Path:
        """The first run's directory."""
        return Path(self.runs[0].path)

    @property
    def paths(self) -> list[Path]:
        return [Path(r.path) for r in self.runs]

    @property
    def status(self) -> str:
        bad = [r.status for r in self.runs if r.status != "complete"]
        return bad[0] if bad else "complete"

    def values(self, metric: str) -> list[float]:
        """``metric`` (grammar name, e.g. ``ttft.p99``) in each repeat."""
        out: list[float] = []
        for r in self.runs:
            s = summary_of(r)
            path, raw = resolve_metric(s, metric)
            value = number_or_none(metric, path, raw, s)
            if value is not None:
                out.append(value)
        return out

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.runs)

    def __getitem__(self, index: int) -> Any:
        return self.runs[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        from perfscope.api.results import summary_attribute

        return summary_attribute(self.__dict__["summary"], name, "RunSet")

    def __repr__(self) -> str:
        return f"RunSet({len(self.runs)} runs, first={str(self.path)!r})"


def runs_of(target: Any) -> list[Any]:
    if isinstance(target, RunSet):
        return target.runs
    return [target]


def run_dirs(target: Any) -> list[str]:
    out = []
    for r in runs_of(target):
        p = getattr(r, "path", None)
        if p is not None:
            out.append(str(p))
    return out


def load_if_path(target: Any) -> Any:
    if isinstance(target, Path):
        from perfscope.api.results import load_run

        return load_run(target)
    return target


def samples_of(target: Any, metric: str) -> list[float]:
    """``metric`` in each run of ``target`` (one value for a single run; none if null)."""
    target = load_if_path(target)
    if isinstance(target, RunSet):
        return target.values(metric)
    s = summary_of(target)
    path, raw = resolve_metric(s, metric)
    value = number_or_none(metric, path, raw, s)
    return [] if value is None else [value]
