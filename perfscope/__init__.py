"""perfscope: inference performance profiler and roofline analyzer.

The public surface is small; everything else lives in private modules or the component
packages (``perfscope.profiler``, ``perfscope.hwdb``, ``perfscope.analysis``,
``perfscope.dashboard``)::

    import perfscope

    with perfscope.profile(name="my-engine") as p:
        with p.request(prompt_tokens=16) as r:
            r.tokens(1)
    run = p.run                      # stored and analysed
    run = perfscope.load_run("latest")
    print(run.ttft.p50, run.throughput.output_tok_s)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Profile",
    "Run",
    "RunOptions",
    "__version__",
    "check",
    "execute_run",
    "expect",
    "load_run",
    "profile",
]

if TYPE_CHECKING:
    from perfscope._expect import check, expect
    from perfscope._manual import Profile, profile
    from perfscope._run import Run, load_run
    from perfscope._runner import RunOptions, execute_run

_LAZY = {
    "Profile": "perfscope._manual",
    "profile": "perfscope._manual",
    "Run": "perfscope._run",
    "load_run": "perfscope._run",
    "RunOptions": "perfscope._runner",
    "execute_run": "perfscope._runner",
    "expect": "perfscope._expect",
    "check": "perfscope._expect",
}


def __getattr__(name: str) -> Any:
    # Lazy so that `import perfscope.errors` (used by every component) stays cheap and
    # free of import cycles.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfscope' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
