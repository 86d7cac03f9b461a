"""The ``perfscope`` fixture: run workloads through :func:`perfscope.run`, record them on
the test, and assert on them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perfscope.pytest_plugin._state import (
    MARK,
    MarkerOptions,
    SessionState,
    TestRecord,
    state_of,
)

if TYPE_CHECKING:
    from perfscope.analysis.experiment import SetChange
    from perfscope.api.manual import Profile
    from perfscope.checks.expect import Outcome

__all__ = ["PerfscopeFixture", "perfscope"]


#: The keywords of :func:`perfscope.run` that :meth:`PerfscopeFixture.run` passes itself.
_OWN_KEYWORDS = frozenset(
    (
        "requests",
        "prompt_len",
        "output_len",
        "warmup",
        "mode",
        "rate",
        "concurrency",
        "batch_size",
        "scheduler",
        "model_preset",
        "device",
        "dtype",
        "seed",
        "slos",
        "name",
        "hw",
    )
)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "test"


class PerfscopeFixture:
    """What the ``perfscope`` fixture gives a test: run workloads, assert on them.

    Every run made here is stored under the test's runs folder, recorded for the
    session's summary table, baselines and JSON report, and checked against the test's
    ``@pytest.mark.perfscope`` SLOs when the test body ends.
    """

    def __init__(
        self,
        item: pytest.Item,
        state: SessionState | None,
        options: MarkerOptions,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        self._item = item
        self._state = state
        self._options = options
        self._tmp = tmp_path_factory
        self._runs_dir: Path | None = None
        self._record = state.record_for(item) if state else TestRecord(item.nodeid)

    @property
    def runs_dir(self) -> Path:
        """Where this test's runs are stored."""
        if self._runs_dir is None:
            if self._state is not None and self._state.runs_dir is not None:
                self._runs_dir = self._state.runs_dir
            else:
                self._runs_dir = self._tmp.mktemp(f"perfscope-{_slug(self._item.name)}")
        return self._runs_dir

    @property
    def runs(self) -> list[Any]:
        """Every Run/RunSet this test has made or asserted on, in order."""
        return [m.target for m in self._record.measurements]

    def run(
        self,
        engine: Any = "reference",
        *,
        requests: int = 16,
        prompt_len: int | str = 64,
        output_len: int | str = 16,
        warmup: int = 1,
        mode: str | None = None,
        rate: float | None = None,
        concurrency: int | None = None,
        batch_size: int = 8,
        scheduler: str = "continuous",
        model_preset: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        slos: Mapping[str, str | float] | None = None,
        repeat: int | None = None,
        name: str | None = None,
        hw: str | None = None,
        engine_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Any:
        """Run a workload on ``engine`` with :func:`perfscope.run` and return the analysed
        :class:`perfscope.Run` (a :class:`perfscope.RunSet` of the repeats when
        ``repeat > 1``). Defaults are small (16 requests of 64 + 16 tokens, one warmup).

        Args:
            engine: an engine URI (``"reference"``, ``"python:mod:fn"``, ``"openai:URL"``),
                a Python callable that yields tokens (see the ``python:`` engine), or an
                object implementing the Engine protocol.
            requests, prompt_len, output_len, warmup, seed: the workload (lengths as
                ``128`` or ``"uniform:64:256"``); warmup requests are not measured.
            mode, rate, concurrency: arrivals; ``rate`` or ``concurrency`` implies online.
            batch_size, scheduler, model_preset, device, dtype: engine options
                (``model_preset="tiny"`` keeps the reference model fast).
            slos: per-request limits for goodput, ``{"ttft": "200ms", "tpot": 0.05}``.
            repeat: run the workload N times (default: the marker's, then
                ``--perfscope-repeat``, then 1).
            name: short name of the run (its id and the baseline key of the second and
                later runs of a test).
            hw: device to analyse against (default: detect).
            engine_options: engine-specific options (as ``**`` keywords of
                :func:`perfscope.run`); kept for tests written before ``**options``.
            **options: any other keyword of :func:`perfscope.run` (``duration``,
                ``telemetry``, ``model_overrides``, engine-specific options, ...).
        """
        from perfscope.api.run import run
        from perfscope.api.runset import RunSet
        from perfscope.errors import UsageError
        from perfscope.profiler.engines.base import Engine

        n = repeat or self._options.repeat or (self._state.repeat if self._state else None) or 1
        if n < 1:
            raise UsageError(f"repeat must be at least 1, got {n}")
        if n > 1 and isinstance(engine, Engine):
            raise UsageError(
                "an Engine object serves one run (it is closed afterwards); for repeat > 1 "
                "pass an engine URI or a callable"
            )
        if "runs_dir" in options or "command" in options:
            raise UsageError("the perfscope fixture chooses runs_dir and command itself")
        # engine_options: engine-specific, so no keyword this method names itself
        extra = {**(engine_options or {}), **options}
        if clash := sorted(set(extra) & _OWN_KEYWORDS):
            raise UsageError(
                f"engine_options names {', '.join(clash)}, a keyword of perfscope.run(): "
                "pass it as that keyword"
            )
        runs = [
            run(
                engine,
                runs_dir=self.runs_dir,
                command=["pytest", self._item.nodeid],
                requests=requests,
                prompt_len=prompt_len,
                output_len=output_len,
                warmup=warmup,
                mode=mode,
                rate=rate,
                concurrency=concurrency,
                batch_size=batch_size,
                scheduler=scheduler,
                model_preset=model_preset,
                device=device,
                dtype=dtype,
                seed=seed,
                slos=slos,
                name=name,
                hw=hw,
                **extra,
            )
            for _ in range(n)
        ]
        target = runs[0] if n == 1 else RunSet(runs)
        self._record.add(target, name)
        return target

    @contextmanager
    def profile(self, name: str = "manual", **kwargs: Any) -> Iterator[Profile]:
        """Record a run by hand (``perfscope.profile``) into this test's runs folder::

        with perfscope.profile("my-engine") as p:
            with p.request(prompt_tokens=16) as r:
                r.tokens(1)
        run = p.run
        """
        from perfscope.api.manual import profile

        p = profile(name=name, runs_dir=kwargs.pop("runs_dir", None) or self.runs_dir, **kwargs)
        with p:
            yield p
        self._record.add(p.run, name)

    def record(self, run: Any, name: str | None = None) -> Any:
        """Record a run made elsewhere (``perfscope.load_run``, a module-scoped fixture) as
        one of this test's measurements; returns it."""
        self._record.add(run, name)
        return run

    def expect(self, run: Any, *, stat: str | None = None, confidence: float | None = None) -> Any:
        """``perfscope.expect(run).ttft.p99 < "200ms"`` (see :func:`perfscope.expect`)."""
        from perfscope.checks.expect import expect

        return expect(
            run,
            stat=stat or self._options.stat,
            confidence=confidence or self._options.confidence,
        )

    def check(
        self,
        run: Any,
        *assertions: Any,
        stat: str | None = None,
        confidence: float | None = None,
    ) -> list[Outcome]:
        """``perfscope.check(run, "ttft.p99 < 200ms", ...)`` (see :func:`perfscope.check`)."""
        from perfscope.checks.expect import check

        __tracebackhide__ = True
        return check(
            run,
            *assertions,
            stat=stat or self._options.stat,
            confidence=confidence or self._options.confidence,
        )

    def compare(
        self, before: Any, after: Any, metric: str, *, tolerance: str | float = "0%"
    ) -> SetChange:
        """How ``metric`` moved from ``before`` to ``after``, judged against the noise."""
        from perfscope.checks.change import compare_runs

        return compare_runs(
            before, after, metric, tolerance=tolerance, confidence=self._options.confidence
        )

    def assert_no_regression(
        self, before: Any, after: Any, *metrics: str, tolerance: str | float = "0%"
    ) -> list[SetChange]:
        """Fail only when a metric got worse by more than ``tolerance`` and the measured
        noise (both sides need ``repeat >= 4``)."""
        from perfscope.checks.change import assert_no_regression

        __tracebackhide__ = True
        return assert_no_regression(
            before, after, *metrics, tolerance=tolerance, confidence=self._options.confidence
        )


@pytest.fixture
def perfscope(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> PerfscopeFixture:
    """Run workloads on engines and assert on their performance (see the module doc)."""
    item = request.node
    assert isinstance(item, pytest.Item)
    options = item.stash.get(MARK, None) or MarkerOptions()
    return PerfscopeFixture(item, state_of(request.config), options, tmp_path_factory)
