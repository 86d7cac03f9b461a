"""perfscope: inference performance profiler and roofline analyzer.

The public surface is small; everything else lives in private modules or the component
packages (``perfscope.profiler``, ``perfscope.hwdb``, ``perfscope.analysis``,
``perfscope.dashboard``)::

    import perfscope

    run = perfscope.run("reference", model_preset="tiny", requests=16, rate=8,
                        slos={"ttft": "200ms"})
    print(run.ttft.p50, run.throughput.output_tok_s)   # seconds, tokens/s
    perfscope.check(run, "ttft.p99 < 500ms", "goodput.attainment >= 90%")

    with perfscope.profile(name="my-engine") as p:     # instrument your own loop
        with p.request(prompt_tokens=16) as r:
            r.tokens(1)
    run = perfscope.load_run("latest")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "PerfAssertionError",
    "Profile",
    "ProgressHook",
    "Run",
    "RunSet",
    "Sweep",
    "__version__",
    "assert_no_regression",
    "check",
    "compare_runs",
    "expect",
    "load_run",
    "profile",
    "run",
    "save_study",
    "study",
    "study_quality",
    "sweep",
]

if TYPE_CHECKING:
    from perfscope.api.manual import Profile, profile
    from perfscope.api.results import Run, load_run
    from perfscope.api.run import Sweep, run, sweep
    from perfscope.api.runner import ProgressHook
    from perfscope.api.runset import RunSet
    from perfscope.api.study import save_study, study, study_quality
    from perfscope.checks.change import assert_no_regression, compare_runs
    from perfscope.checks.expect import check, expect
    from perfscope.errors import PerfAssertionError

_LAZY = {
    "run": "perfscope.api.run",
    "sweep": "perfscope.api.run",
    "study": "perfscope.api.study",
    "save_study": "perfscope.api.study",
    "study_quality": "perfscope.api.study",
    "Sweep": "perfscope.api.run",
    "Profile": "perfscope.api.manual",
    "profile": "perfscope.api.manual",
    "Run": "perfscope.api.results",
    "load_run": "perfscope.api.results",
    "ProgressHook": "perfscope.api.runner",
    "RunSet": "perfscope.api.runset",
    "expect": "perfscope.checks.expect",
    "check": "perfscope.checks.expect",
    "PerfAssertionError": "perfscope.errors",
    "compare_runs": "perfscope.checks.change",
    "assert_no_regression": "perfscope.checks.change",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import perfscope.errors` (used by every component) stays cheap and
    # free of import cycles.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
