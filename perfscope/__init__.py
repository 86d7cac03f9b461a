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
    "study",
    "sweep",
]

if TYPE_CHECKING:
    from perfscope._api import Sweep, run, sweep
    from perfscope._change import assert_no_regression, compare_runs
    from perfscope._expect import check, expect
    from perfscope._manual import Profile, profile
    from perfscope._run import Run, load_run
    from perfscope._runner import ProgressHook
    from perfscope._runset import RunSet
    from perfscope._study import study
    from perfscope.errors import PerfAssertionError

_LAZY = {
    "run": "perfscope._api",
    "sweep": "perfscope._api",
    "study": "perfscope._study",
    "Sweep": "perfscope._api",
    "Profile": "perfscope._manual",
    "profile": "perfscope._manual",
    "Run": "perfscope._run",
    "load_run": "perfscope._run",
    "ProgressHook": "perfscope._runner",
    "RunSet": "perfscope._runset",
    "expect": "perfscope._expect",
    "check": "perfscope._expect",
    "PerfAssertionError": "perfscope.errors",
    "compare_runs": "perfscope._change",
    "assert_no_regression": "perfscope._change",
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
