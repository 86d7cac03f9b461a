"""The manual API: instrument any engine by hand.

::

    with perfscope.profile(name="my-engine", runs_dir="runs") as p:
        for prompt in prompts:
            with p.request(prompt_tokens=len(prompt)) as r:
                for chunk in my_engine.stream(prompt):
                    r.tokens(len(chunk))
    print(p.run.ttft.p50)

Durability is that of ``perfscope run`` (docs/architecture.md): entering the block creates the run
directory with a ``running`` manifest that carries this process's liveness record, and a
background flusher copies new records into segment files every
:data:`~perfscope.profiler.capture.FLUSH_INTERVAL_S` seconds (refreshing the heartbeat). A
process killed inside the block leaves a run that reads as ``crashed`` with everything
flushed; leaving the block compacts the tables and removes the segments. The lifecycle is the
capture stage's :class:`~perfscope.profiler.capture.RunCapture`, the one ``perfscope run``
uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from perfscope import __version__
from perfscope.api.analyze import analyze_stored
from perfscope.api.results import Run
from perfscope.hwdb import resolve_hardware
from perfscope.jsontypes import ReadOnlyJson
from perfscope.profiler.capture import RunCapture, run_manifest
from perfscope.profiler.clock import Clock, MonotonicClock
from perfscope.profiler.engines.base import EngineInfo
from perfscope.profiler.recorder import Recorder, RequestHandle
from perfscope.profiler.records import Manifest, RequestSpec, StepKind
from perfscope.profiler.store import default_runs_root

__all__ = ["Profile", "profile"]


class Profile:
    """A run being recorded by hand. Use through :func:`profile`."""

    def __init__(
        self,
        name: str,
        runs_dir: Path,
        slos: dict[str, float],
        model: ReadOnlyJson | None,
        hw: str | None,
        clock: Clock | None,
    ) -> None:
        self.name = name
        self.runs_dir = runs_dir
        self.slos = slos
        self.model = model
        self.hw = hw
        self.clock: Clock = clock or MonotonicClock()
        self.recorder = Recorder(self.clock)
        self._ids = itertools.count()
        self._run: Run | None = None
        self.path: Path | None = None
        self._capture: RunCapture | None = None

    def request(
        self,
        prompt_tokens: int = 0,
        max_output_tokens: int | None = None,
        *,
        warmup: bool = False,
    ) -> RequestHandle:
        """A new request, scheduled now. Use as ``with p.request(...) as r: r.tokens(n)``:
        entering marks it sent, leaving finishes it (an exception marks it failed)."""
        spec = RequestSpec(
            request_id=next(self._ids),
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens or 0,
            is_warmup=warmup,
        )
        return self.recorder.add_request(spec)

    @contextmanager
    def step(
        self,
        kind: StepKind,
        *,
        batch_size: int,
        new_tokens: int,
        context_tokens: int = 0,
        request_ids: tuple[int, ...] = (),
    ) -> Iterator[None]:
        """Time one forward pass: ``with p.step("decode", batch_size=8, new_tokens=8,
        context_tokens=1024): logits = model(...)``. Synchronise the device inside the block
        (e.g. ``torch.cuda.synchronize()``) so the time is the pass's, not its launch's."""
        t0 = self.clock.now_ns()
        yield
        self.recorder.step(
            kind, t0, self.clock.now_ns(), batch_size, new_tokens, context_tokens, request_ids
        )

    def record_step(
        self,
        kind: StepKind,
        t_start_ns: int,
        t_end_ns: int,
        *,
        batch_size: int,
        new_tokens: int,
        context_tokens: int = 0,
        request_ids: tuple[int, ...] = (),
    ) -> None:
        """Record a forward pass timed by the caller (run-relative ns, see ``p.clock``)."""
        self.recorder.step(
            kind, t_start_ns, t_end_ns, batch_size, new_tokens, context_tokens, request_ids
        )

    @property
    def run(self) -> Run:
        """The stored, analysed run (after the ``with`` block)."""
        if self._run is None:
            raise RuntimeError("p.run is available after the 'with perfscope.profile()' block")
        return self._run

    def _start(self) -> None:
        """Create the run directory, write the ``running`` manifest (with this process's
        liveness record) and start flushing segments."""
        manifest = replace(
            run_manifest(self.name, self.clock, perfscope_version=__version__),
            engine=EngineInfo(
                uri="manual",
                kind="manual",
                model=None if self.model is None else dict(self.model),
            ).to_dict(),
            workload={"requests": 0},
            load={"mode": "manual"},
            slos=self.slos,
            hw=self.hw,
            hardware=resolve_hardware({"kind": "manual"}, self.hw),
        )
        self._capture = RunCapture.begin(
            self.runs_dir, manifest, self.recorder, started_at=self.clock.started_at
        ).start()
        self.path = self._capture.path

    def _finish(self, status: str, error: str | None) -> None:
        if self._capture is None:
            self._start()  # used without entering the block: write it all now
        assert self._capture is not None
        recorder = self.recorder

        def annotate(m: Manifest) -> None:
            m.workload = {"requests": recorder.n_requests}

        captured = self._capture.end(status, error, annotate=annotate)
        summary = analyze_stored(captured.stored)  # writes summary.json
        self._run = Run(captured.stored, summary)

    def __enter__(self) -> Profile:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self._finish("complete", None)
        elif isinstance(exc, KeyboardInterrupt):
            self._finish("interrupted", "interrupted by the user (Ctrl-C)")
        else:
            self._finish("failed", f"{type(exc).__name__}: {exc}")


def profile(
    name: str = "manual",
    runs_dir: str | Path | None = None,
    *,
    slos: dict[str, float] | None = None,
    model: ReadOnlyJson | None = None,
    hw: str | None = None,
    clock: Clock | None = None,
) -> Profile:
    """Start recording a run by hand (see the module docstring).

    Args:
        name: short name in the run id.
        runs_dir: root of run directories (default ``$PERFSCOPE_RUNS_DIR`` or
            ``./perfscope-runs``).
        slos: per-request limits in seconds, e.g. ``{"ttft": 0.2}``.
        model: ``ModelSpec`` fields, when known, for the roofline.
        hw: device to analyse against (default: detect).
        clock: inject a clock (tests).
    """
    return Profile(
        name=name,
        runs_dir=Path(runs_dir) if runs_dir is not None else default_runs_root(),
        slos=dict(slos or {}),
        model=model,
        hw=hw,
        clock=clock,
    )
