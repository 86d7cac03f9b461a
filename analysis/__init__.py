"""Analysis: metrics, model spec and cost model, roofline, energy, advisor, summary.

The stage's entry point is :func:`analyze` (a run's records → its typed :class:`Summary`);
:mod:`perfscope.analysis.catalogue` names, units, directions and formats every metric.
Names are imported lazily so ``import perfscope.analysis.slo`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["RunRecords", "Summary", "analyze"]

if TYPE_CHECKING:
    from perfscope.analysis.pipeline import analyze
    from perfscope.analysis.run_records import RunRecords
    from perfscope.analysis.summary import Summary

_LAZY = {
    "analyze": "perfscope.analysis.pipeline",
    "RunRecords": "perfscope.analysis.run_records",
    "Summary": "perfscope.analysis.summary",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfscope.analysis' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
