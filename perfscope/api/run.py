"""``perfscope.run()`` and ``perfscope.sweep()``: the one library entry point for a run.

Every way of starting a run (the ``perfscope run`` and ``perfscope sweep`` commands, the
pytest fixture, a user's script) comes through here. :func:`plan` turns the keyword
arguments into the capture layer's config objects (``WorkloadConfig``, ``LoadConfig``,
``EngineOptions``, ``TelemetryConfig``, ``RunOptions``) and holds every option-assembly rule
once: a rate or a concurrency implies online arrivals, a duration sizes the request pool,
``openai:`` engines default to synthetic prompt text, durations take units, and so on.
:func:`execute` hands the plan to :func:`perfscope.api.runner.execute_run`.

Each keyword of :func:`run` is the ``perfscope run`` flag of the same name (``--prompt-len``
→ ``prompt_len``); ``**engine_options`` are ``--engine-opt KEY=VALUE``.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from perfscope.errors import EngineError, RunNotFoundError, UsageError
from perfscope.jsontypes import JsonObject

if TYPE_CHECKING:
    from perfscope.analysis.modelspec import ModelSpec
    from perfscope.analysis.sweep import SweepKnee, SweepPoint, SweepProbe, SweepSummary
    from perfscope.api.results import Run
    from perfscope.api.runner import ProgressHook, RunOptions, RunOutcome
    from perfscope.profiler.engines.base import Engine, EngineOptions

__all__ = [
    "RunArgs",
    "RunPlan",
    "Sweep",
    "auto_rates",
    "execute",
    "plan",
    "run",
    "run_with",
    "slo_seconds",
    "sweep",
    "sweep_with",
]

#: What ``engine`` may be: a URI, a callable that yields tokens, or an Engine object.
EngineLike = Any

#: Default measured requests of :func:`run` (``perfscope run``) and per :func:`sweep` point.
DEFAULT_REQUESTS = 48
DEFAULT_SWEEP_REQUESTS = 32
#: Output length when none is given; a given one wins over a dataset's reply lengths.
DEFAULT_OUTPUT_LEN = 128


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """The arguments of :func:`run`, as one record (see :func:`run` for each field)."""

    engine: EngineLike = "reference"
    requests: int | None = None
    prompt_len: int | str = 128
    output_len: int | str | None = None
    prompts: str | Path | None = None
    dataset: str | None = None
    prefix_len: int = 0
    prefix_groups: int = 1
    tokenizer: str | Path | None = None
    warmup: int = 0
    #: Seeds lengths and arrivals (None: 0) and fixes the generated prompt text; None also
    #: draws a fresh prompt salt per run so no server answers a rerun from its prefix cache.
    seed: int | None = None
    trace: str | Path | None = None
    turns: int = 3
    mode: str | None = None
    rate: float | None = None
    concurrency: int | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    duration: float | str | None = None
    warmup_duration: float | str | None = None
    batch_size: int = 8
    scheduler: str = "continuous"
    batch_timeout: float | str = 0.0
    device: str | None = None
    dtype: str | None = None
    model_preset: str | None = None
    model_overrides: Mapping[str, int] | None = None
    stop_on_eos: bool = False
    slos: Mapping[str, float | str] | None = None
    hw: str | None = None
    telemetry: bool = True
    telemetry_interval: float | str = 0.05
    gpus: Sequence[int] | str | None = None
    nvtx: bool | None = None
    runs_dir: str | Path | None = None
    name: str | None = None
    command: Sequence[str] | None = None
    ray: str | None = None
    #: With ``ray``: add load actors, up to this many, when one's event-loop lag grows.
    ray_autoscale: int | None = None
    #: With ``ray``: what each load actor asks Ray for (``"loadgen=1"`` or a mapping).
    ray_resources: str | Mapping[str, float] | None = None
    #: The model an engine that reports none (HTTP, python) serves: a preset name, a
    #: ``config.json`` or its folder, a ModelSpec or its dict; gives an estimated roofline.
    model_spec: str | Path | Mapping[str, Any] | ModelSpec | None = None
    #: The server's Prometheus metrics: ``auto`` (an HTTP engine's ``/metrics`` if it
    #: answers), a URL, or ``off``; sampled every ``server_metrics_interval``.
    server_metrics: str | None = "auto"
    server_metrics_interval: float | str = 1.0
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    #: Requests when ``requests`` is None and nothing else sizes the workload.
    default_requests: int = DEFAULT_REQUESTS
    #: Name arguments as command-line flags (``--prompt-len``) in error messages.
    cli: bool = False

    def arg(self, name: str) -> str:
        """How an error message names argument ``name``."""
        return "--" + name.replace("_", "-") if self.cli else name


_RUN_ARG_NAMES = frozenset(f.name for f in fields(RunArgs)) - {
    "engine_options",
    "default_requests",
    "cli",
}


@dataclass(frozen=True)
class RunPlan:
    """A run, ready to execute: the capture options and how to build the engine.

    Attributes:
        options: everything :func:`perfscope.api.runner.execute_run` needs.
        engine_factory: builds the engine from ``(uri, EngineOptions)``; ``None`` = the
            registry (by URI scheme).
    """

    options: RunOptions
    engine_factory: Callable[[str, EngineOptions], Engine] | None = None


# --------------------------------------------------------------------------- checks


def _whole(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise UsageError(f"{what} must be a whole number, got {value!r}")
    if value < minimum:
        raise UsageError(f"{what} must be at least {minimum}, got {value}")
    return int(value)


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{what} must be a number, got {value!r}")
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise UsageError(f"{what} must be a positive number, got {value!r}")
    return v


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{what} must be a number, got {value!r}")
    return float(value)


def _seconds(value: float | str, what: str) -> float:
    """A duration: seconds as a number, or a string with a unit (``"50ms"``)."""
    from perfscope.analysis.slo import parse_duration

    if isinstance(value, str):
        return parse_duration(value.strip())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{what} must be seconds or a duration such as '50ms', got {value!r}")
    return float(value)


def _choice(value: Any, what: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise UsageError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def slo_seconds(slos: Mapping[str, float | str] | None) -> dict[str, float]:
    """``{"ttft": "200ms", "tpot": 0.05}`` → ``{"ttft": 0.2, "tpot": 0.05}`` (seconds)."""
    from perfscope.analysis.slo import SLO_METRICS, parse_slos

    out: dict[str, float] = {}
    for key, value in (slos or {}).items():
        metric = str(key).strip().lower()
        if isinstance(value, str):
            out.update(parse_slos([f"{metric}={value}"]))
            continue
        if metric not in SLO_METRICS:
            raise UsageError(f"unknown SLO metric {key!r}: use one of {', '.join(SLO_METRICS)}")
        out[metric] = _positive(value, f"SLO {key}")
    return out


def _extra_text(value: Any) -> str:
    """Engine-specific option values are text (``--engine-opt KEY=VALUE``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value)
    return str(value)


# --------------------------------------------------------------------------- engines


def _engine_factory(
    engine: EngineLike,
) -> tuple[str, Callable[[str, EngineOptions], Engine] | None]:
    """The engine's URI and, for callables and Engine objects, how to build it."""
    from perfscope.profiler.engines.base import Engine

    if isinstance(engine, str):
        if not engine.strip():
            raise UsageError("engine must not be empty: use 'reference', 'python:MOD:FN', ...")
        return engine, None
    if isinstance(engine, Engine):
        instance = engine
        return instance.info().uri, lambda uri, opts: instance
    if callable(engine):
        from perfscope.profiler.engines.python_callable import PythonCallableEngine

        fn = engine
        qual = getattr(fn, "__qualname__", type(fn).__name__)
        uri = f"python:{getattr(fn, '__module__', '?')}:{qual}"
        return uri, lambda uri_, opts: PythonCallableEngine(uri_, fn)
    raise UsageError(
        f"engine must be a URI string, a callable that yields tokens or an Engine, "
        f"not {type(engine).__name__}"
    )


class _EngineFields(TypedDict, total=False):
    """The :class:`EngineOptions` fields an engine option (``--engine-opt KEY=VALUE``, a
    ``**engine_options`` keyword) may set, each as its field holds it."""

    max_seq_len: int
    longest_request_tokens: int | None
    request_timeout_s: float | None


def _whole_option(value: object, what: str, minimum: int) -> int:
    """A whole-number engine option: a number, or its text (``--engine-opt`` values are)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return _whole(value, what, minimum)


def _seconds_option(value: object, what: str) -> float:
    """A duration engine option: seconds as a number, or text with or without a unit."""
    if isinstance(value, str | int | float):
        return _seconds(value, what)
    raise UsageError(f"{what} must be seconds or a duration such as '50ms', got {value!r}")


def _engine_options(a: RunArgs, uri: str) -> EngineOptions:
    from perfscope.profiler.engines.base import EngineOptions

    batch_size = _whole(a.batch_size, a.arg("batch_size"), 1)
    scheduler = _choice(a.scheduler, a.arg("scheduler"), ("continuous", "static"))
    batch_timeout_s = _seconds(a.batch_timeout, a.arg("batch_timeout"))
    dtype = (
        a.dtype
        if a.dtype is None
        else _choice(a.dtype, a.arg("dtype"), ("float32", "bfloat16", "float16"))
    )
    model_overrides = {
        str(k): _whole(v, f"model_overrides[{k!r}]", 1)
        for k, v in (a.model_overrides or {}).items()
    }
    if batch_timeout_s < 0:
        raise UsageError(f"{a.arg('batch_timeout')} must not be negative, got {a.batch_timeout!r}")
    extra: dict[str, str] = {}
    if a.tokenizer is not None and uri.startswith("openai"):
        extra["tokenizer"] = str(a.tokenizer)
    set_fields = _EngineFields()
    own = {f.name for f in fields(EngineOptions)} - {"extra"}
    for key, value in a.engine_options.items():
        what = f"engine option {key}"
        if key == "extra":
            if not isinstance(value, Mapping):
                raise UsageError(f"{what} must be a mapping of options, got {value!r}")
            extra.update({str(k): _extra_text(v) for k, v in value.items()})
        elif key == "max_seq_len":
            set_fields["max_seq_len"] = _whole_option(value, what, 1)
        elif key == "longest_request_tokens":
            n = None if value is None else _whole_option(value, what, 1)
            set_fields["longest_request_tokens"] = n
        elif key == "request_timeout_s":
            t = None if value is None else _seconds_option(value, what)
            set_fields["request_timeout_s"] = t
        elif key == "batch_timeout_s":
            batch_timeout_s = _seconds_option(value, what)
            if batch_timeout_s < 0:
                raise UsageError(f"{what} must not be negative, got {value!r}")
        elif key in own:  # a field the run's own arguments set
            raise UsageError(f"{what} is an argument of the run: give {a.arg(key)} instead")
        else:
            extra[str(key)] = _extra_text(value)
    return EngineOptions(
        batch_size=batch_size,
        scheduler=scheduler,
        batch_timeout_s=batch_timeout_s,
        device=a.device,
        dtype=dtype,
        seed=0 if a.seed is None else a.seed,
        model_preset=a.model_preset,
        model_overrides=model_overrides,
        stop_on_eos=bool(a.stop_on_eos),
        extra=extra,
        **set_fields,
    )


# --------------------------------------------------------------------------- workload


def _pool(seconds: float, rate: float | None, concurrency: int | None) -> int:
    """Requests a load can send in ``seconds``: the rate's mean count plus five standard
    deviations of a Poisson count, or 200 per closed-loop user."""
    if rate is not None:
        mean = rate * seconds
        return math.ceil(mean + 5 * math.sqrt(mean) + 10)
    return 200 * (concurrency or 1)


class _DatasetFields(TypedDict, total=False):
    """The :class:`~perfscope.profiler.workload.WorkloadConfig` fields the prompt source
    sets (a dataset, a trace, a tokenizer), passed on as its keywords."""

    tokenizer: str | None
    trace_file: Path | None
    server_tokenizer: str | None
    turns: int
    dataset: str
    dataset_path: Path | None
    prefix_len: int
    prefix_groups: int
    output_len_given: bool


def _dataset_fields(a: RunArgs, uri: str) -> _DatasetFields:
    spec = a.dataset
    # openai: servers need prompt text; token counts alone cannot be sent.
    if spec is None and uri.startswith("openai") and a.prompts is None:
        spec = "synthetic"
    tokenizer = str(a.tokenizer) if a.tokenizer is not None else None
    trace = Path(a.trace) if a.trace is not None else None
    if spec is None:
        return {"tokenizer": tokenizer, "trace_file": trace}
    kind, _, path = str(spec).partition(":")
    server_tok = None
    if uri.startswith("openai:") and tokenizer is None and "@" not in uri:
        # Exact generated prompt lengths from the server's own /tokenize where it has one.
        base = uri.split(":", 1)[1].strip().rstrip("/")
        base = base if "://" in base else "http://" + base
        server_tok = base.removesuffix("/v1")
    return {
        "server_tokenizer": server_tok,
        "trace_file": trace,
        "turns": _whole(a.turns, a.arg("turns"), 1),
        "dataset": kind.strip().lower(),
        "dataset_path": Path(path) if path else None,
        "prefix_len": _whole(a.prefix_len, a.arg("prefix_len"), 0),
        "prefix_groups": _whole(a.prefix_groups, a.arg("prefix_groups"), 1),
        "tokenizer": tokenizer,
        # Dataset reply lengths (ShareGPT) are the output lengths unless one is given.
        "output_len_given": a.output_len is not None,
    }


def _model_spec(a: RunArgs) -> JsonObject | None:
    """``model_spec`` resolved to a ModelSpec dict marked as given by the user
    (``source``, ``estimated``, ``method``); ``None`` when not given."""
    from perfscope.analysis.modelspec import ModelSpec

    given = a.model_spec
    if given is None or given == "":
        return None
    if isinstance(given, ModelSpec):
        spec, source = given, f"{a.arg('model_spec')} {given.name}"
    elif isinstance(given, Mapping):
        try:
            spec = ModelSpec.from_dict(dict(given))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{a.arg('model_spec')}: not a model spec ({exc})") from None
        source = f"{a.arg('model_spec')} (a dict)"
    elif isinstance(given, str | Path):
        try:
            spec = ModelSpec.resolve(str(given))
        except UsageError as exc:
            raise UsageError(f"{a.arg('model_spec')} {given}: {exc}") from None
        source = f"{a.arg('model_spec')} {given}"
    else:
        raise UsageError(
            f"{a.arg('model_spec')} must be a preset name, a config.json path or a ModelSpec, "
            f"got {type(given).__name__}"
        )
    from perfscope.analysis.costmodel import model_assumptions

    out: JsonObject = dict(spec.to_dict())
    out["source"] = source
    out["estimated"] = True
    # the family and every counting assumption, as perfscope roofline --model prints them
    out["assumptions"] = list(model_assumptions(spec))
    out["method"] = (
        f"model shape from {a.arg('model_spec')}; FLOPs and bytes from perfscope's analytic "
        "cost model; for engines without steps, phase times estimated from the request "
        "timeline"
    )
    return out


# --------------------------------------------------------------------------- plan


def plan(a: RunArgs) -> RunPlan:
    """Assemble the capture options of a run from its arguments; raises
    :class:`perfscope.errors.UsageError` (one line, naming the argument) on bad input,
    before anything runs or is written."""
    from perfscope.api.runner import RunOptions
    from perfscope.profiler.driver import LoadConfig
    from perfscope.profiler.telemetry import TelemetryConfig, parse_gpus
    from perfscope.profiler.workload import WorkloadConfig, parse_length

    uri, factory = _engine_factory(a.engine)
    # Types here; ranges in LoadConfig.validate (its messages name the CLI flags).
    rate = None if a.rate is None else _number(a.rate, a.arg("rate"))
    concurrency = None if a.concurrency is None else _whole(a.concurrency, a.arg("concurrency"), 0)
    # A rate or a concurrency only means something online: it implies online arrivals
    # (also over mode="batch", as ``perfscope run --rate`` always has).
    if rate is not None or concurrency is not None:
        mode = "online"
    else:
        mode = "batch" if a.mode is None else a.mode
    duration = None if a.duration is None else _seconds(a.duration, a.arg("duration"))
    seed = 0 if a.seed is None else _whole(a.seed, a.arg("seed"), 0)
    warmup_s = (
        None if a.warmup_duration is None else _seconds(a.warmup_duration, a.arg("warmup_duration"))
    )

    load = LoadConfig(
        mode=mode,
        rate=rate,
        concurrency=concurrency,
        arrival=a.arrival,
        burstiness=_number(a.burstiness, a.arg("burstiness")),
        seed=seed,
        duration_s=duration,
        warmup_s=warmup_s,
    )
    load.validate()
    requests = None if a.requests is None else _whole(a.requests, a.arg("requests"), 1)
    warmup = _whole(a.warmup, a.arg("warmup"), 0)
    if requests is None:
        if duration is not None:
            requests = _pool(duration, rate, concurrency)
        elif a.prompts is None and a.trace is None:  # a file: one request per line
            requests = a.default_requests
    if warmup_s is not None:  # a warmup by time replaces the warmup count
        warmup = _pool(warmup_s, rate, concurrency)
    workload = WorkloadConfig(
        requests=requests,
        prompt_len=parse_length(a.prompt_len, a.arg("prompt_len")),
        output_len=parse_length(
            DEFAULT_OUTPUT_LEN if a.output_len is None else a.output_len, "output_len"
        ),
        prompts_file=Path(a.prompts) if a.prompts is not None else None,
        warmup=warmup,
        seed=seed,
        fresh_prompts=a.seed is None,
        **_dataset_fields(a, uri),
    )
    gpus: list[int] | None
    if isinstance(a.gpus, str):
        gpus = parse_gpus(a.gpus)
    else:
        gpus = None if a.gpus is None else [_whole(g, a.arg("gpus"), 0) for g in a.gpus]
    telemetry = TelemetryConfig(
        interval_s=_seconds(a.telemetry_interval, a.arg("telemetry_interval")),
        gpus=gpus,
        enabled=bool(a.telemetry),
    )
    options = RunOptions(
        engine=uri,
        workload=workload,
        load=load,
        engine_options=_engine_options(a, uri),
        slos=slo_seconds(a.slos),
        runs_dir=Path(a.runs_dir) if a.runs_dir is not None else None,
        name=a.name,
        hw=a.hw,
        telemetry=telemetry,
        nvtx=a.nvtx,
        command=list(a.command) if a.command is not None else None,
        ray=a.ray,
        ray_autoscale=_autoscale(a),
        ray_resources=_ray_resources(a),
        model_spec=_model_spec(a),
        server_metrics=_server_metrics(a),
    )
    return RunPlan(options, factory)


def _autoscale(a: RunArgs) -> int | None:
    if a.ray_autoscale is None:
        return None
    if a.ray is None:
        raise UsageError(f"{a.arg('ray_autoscale')} needs --ray (load actors to add to)")
    n = _whole(a.ray_autoscale, a.arg("ray_autoscale"), 1)
    return n


def _ray_resources(a: RunArgs) -> dict[str, float]:
    if a.ray_resources is None:
        return {}
    if a.ray is None:
        raise UsageError(f"{a.arg('ray_resources')} needs --ray (it places the load actors)")
    from perfscope.profiler.capture import ray_resources

    return ray_resources(a.ray_resources, a.arg("ray_resources"))


def _server_metrics(a: RunArgs) -> Any:
    from perfscope.profiler.server_metrics import ServerMetricsConfig

    interval = _seconds(a.server_metrics_interval, a.arg("server_metrics_interval"))
    if interval < 0.05:
        raise UsageError(f"{a.arg('server_metrics_interval')} must be at least 50ms")
    try:
        return ServerMetricsConfig.parse(a.server_metrics, interval)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def execute(p: RunPlan, progress: ProgressHook | None = None) -> RunOutcome:
    """Run a plan and store the run; the outcome says how it ended (never raises for an
    engine failure or Ctrl-C: the captured data is kept and the status says so)."""
    from perfscope.api.runner import execute_run

    if p.engine_factory is None:
        return execute_run(p.options, progress)
    return execute_run(p.options, progress, engine_factory=p.engine_factory)


# --------------------------------------------------------------------------- run


def run(
    engine: EngineLike = "reference",
    *,
    requests: int | None = None,
    prompt_len: int | str = 128,
    output_len: int | str | None = None,
    prompts: str | Path | None = None,
    dataset: str | None = None,
    prefix_len: int = 0,
    prefix_groups: int = 1,
    tokenizer: str | Path | None = None,
    warmup: int = 0,
    seed: int | None = None,
    trace: str | Path | None = None,
    turns: int = 3,
    mode: str | None = None,
    rate: float | None = None,
    concurrency: int | None = None,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    duration: float | str | None = None,
    warmup_duration: float | str | None = None,
    batch_size: int = 8,
    scheduler: str = "continuous",
    batch_timeout: float | str = 0.0,
    device: str | None = None,
    dtype: str | None = None,
    model_preset: str | None = None,
    model_overrides: Mapping[str, int] | None = None,
    stop_on_eos: bool = False,
    slos: Mapping[str, float | str] | None = None,
    hw: str | None = None,
    telemetry: bool = True,
    telemetry_interval: float | str = 0.05,
    gpus: Sequence[int] | str | None = None,
    nvtx: bool | None = None,
    runs_dir: str | Path | None = None,
    name: str | None = None,
    command: Sequence[str] | None = None,
    ray: str | None = None,
    ray_autoscale: int | None = None,
    ray_resources: str | Mapping[str, float] | None = None,
    model_spec: str | Path | Mapping[str, Any] | ModelSpec | None = None,
    server_metrics: str | None = "auto",
    progress: ProgressHook | None = None,
    **engine_options: Any,
) -> Run:
    """Run a workload on an engine, store the run and return it analysed.

    ::

        run = perfscope.run("reference", model_preset="tiny", requests=16, rate=8,
                            slos={"ttft": "200ms", "tpot": "50ms"})
        print(run.ttft.p99, run.throughput.output_tok_s, run.goodput.attainment)

    Durations are seconds (a number) or a string with a unit (``"200ms"``, ``"1.5s"``).

    Torch engines on the CPU: the ``perfscope`` command sets ``OMP_WAIT_POLICY=PASSIVE``
    before torch loads; a Python program must set it itself before importing torch, or its
    OpenMP threads spin while they wait, which on a busy machine measures the contention
    more than the engine (the run records the policy and warns when it was contended).

    Args:
        engine: an engine URI (``"reference"``, ``"hf:PATH"``, ``"openai:URL"``,
            ``"python:MODULE:ATTR"``), a callable that yields tokens (as a ``python:``
            engine), or an object implementing the Engine protocol (it serves one run).
        requests: measured requests (default 48; with ``prompts``, one per line; with
            ``duration``, as many as the load can send in that time).
        prompt_len: prompt tokens: ``128``, ``"uniform:LOW:HIGH"`` or ``"normal:MEAN:STD"``.
        output_len: output tokens, same forms (default 128); when given it wins over a
            dataset's reply lengths.
        prompts: JSONL prompts file (``prompt``/``prompt_tokens``/``prompt_token_ids``).
        dataset: prompt text source, ``KIND[:PATH]``: ``synthetic`` (default for
            ``openai:`` engines), ``sharegpt:FILE``, ``shared-prefix``.
        prefix_len: shared-prefix: tokens every prompt shares.
        prefix_groups: shared-prefix: distinct prefixes.
        tokenizer: ``tokenizer.json`` (or its folder) for exact prompt lengths and client
            token counts.
        warmup: requests run first and excluded from every statistic.
        seed: seeds lengths, arrivals, weights and sampling, and fixes generated prompt
            text; ``None`` (default) seeds with 0 but salts generated prompts afresh each
            run, so a server's prefix cache cannot serve a rerun.
        trace: replay a production trace (JSONL: arrival time, input and output lengths,
            optional prefix ``hash_ids`` as in the Mooncake traces).
        turns: user turns per conversation for ``dataset="multi-turn"``.
        mode: ``"batch"`` (all requests at once, the default) or ``"online"``; ``rate`` or
            ``concurrency`` implies online.
        rate: offered load in requests per second (open loop).
        concurrency: closed loop of this many users.
        arrival: gaps between arrivals at ``rate``: ``poisson``, ``constant``, ``gamma``.
        burstiness: gamma shape for ``arrival="gamma"`` (< 1 burstier, > 1 smoother).
        duration: measured load time (with ``requests``: whichever ends first).
        warmup_duration: warmup load time before measuring (replaces ``warmup``).
        batch_size: most sequences decoded together (batching engines).
        scheduler: ``continuous`` or ``static`` (batching engines).
        batch_timeout: static scheduler: longest a request waits for its batch to fill.
        device: ``cpu``, ``cuda``, ``cuda:1`` (default: CUDA when present).
        dtype: ``float32``, ``bfloat16`` or ``float16`` (default: the engine's).
        model_preset: reference model shape: ``tiny``, ``small``, ``medium``, ``1b``, ``7b``.
        model_overrides: reference model shape fields (``n_layers``, ``hidden_size``,
            ``n_heads``, ``n_kv_heads``, ``intermediate_size``, ``vocab_size``).
        stop_on_eos: let sequences end early on the end-of-sequence token.
        slos: per-request limits for goodput: ``{"ttft": "200ms", "tpot": 0.05}``
            (metrics ``ttft``, ``tpot``, ``e2e``, ``ntpot``).
        hw: device to analyse against (a hardware database key); default: detect.
        telemetry: sample power, memory and utilisation while the run lasts.
        telemetry_interval: sampling interval (at least 20 ms).
        gpus: CUDA device indices to sample (``[0, 1]`` or ``"0,1"``; default: all).
        nvtx: force NVTX ranges on/off; default: on only when Nsight Systems is attached.
        runs_dir: root folder of runs (default ``$PERFSCOPE_RUNS_DIR`` or
            ``./perfscope-runs``).
        name: short name in the run id (default: the engine kind).
        command: the command line recorded in the manifest (default: ``sys.argv``).
        ray: generate the load from Ray actors (``"local:4"``, a cluster address, or
            ``"auto"``); per-request engines only (``openai:``, ``python:``).
        ray_autoscale: with ``ray``, add load actors (up to this many in all) when one's
            event-loop lag exceeds a tenth of the inter-token gap; None: only warn.
        ray_resources: with ``ray``, what each load actor asks Ray for
            (``"loadgen=1"``, ``{"CPU": 1}``, ``"node:10.0.0.5=0.01"``), so the actors
            run only where that is offered (not on the model's GPU node); None: anywhere.
        model_spec: the model an engine that reports none (``openai:``, ``python:``)
            serves: a preset (``"llama-3-8b"``), a Hugging Face ``config.json`` or its
            folder, or a :class:`ModelSpec`; the run then gets an estimated roofline (an
            engine that reports its own model keeps it).
        server_metrics: scrape the server's Prometheus metrics during the run: ``"auto"``
            (an ``openai:`` server's ``/metrics`` when it answers), a URL, or ``"off"``.
        progress: receives ``on_start(total)``, ``on_request_done(id)``, ``on_end()``.
        **engine_options: engine-specific options (``--engine-opt KEY=VALUE``; for
            ``openai:`` e.g. ``model``, ``api_key``, ``endpoint``, ``max_tokens``,
            ``extra_body``, ``timeout`` in seconds); a name of an ``EngineOptions``
            field (``max_seq_len``) sets that field.

    Returns:
        The stored, analysed :class:`perfscope.Run`.

    Raises:
        perfscope.errors.UsageError: an argument is invalid (nothing was run or written).
        perfscope.errors.EngineError: the engine failed or the run was interrupted; what
            was captured is stored in the run directory the message names.
    """
    args = RunArgs(
        engine=engine,
        requests=requests,
        prompt_len=prompt_len,
        output_len=output_len,
        prompts=prompts,
        dataset=dataset,
        prefix_len=prefix_len,
        prefix_groups=prefix_groups,
        tokenizer=tokenizer,
        warmup=warmup,
        seed=seed,
        trace=trace,
        turns=turns,
        mode=mode,
        rate=rate,
        concurrency=concurrency,
        arrival=arrival,
        burstiness=burstiness,
        duration=duration,
        warmup_duration=warmup_duration,
        batch_size=batch_size,
        scheduler=scheduler,
        batch_timeout=batch_timeout,
        device=device,
        dtype=dtype,
        model_preset=model_preset,
        model_overrides=model_overrides,
        stop_on_eos=stop_on_eos,
        slos=slos,
        hw=hw,
        telemetry=telemetry,
        telemetry_interval=telemetry_interval,
        gpus=gpus,
        nvtx=nvtx,
        runs_dir=runs_dir,
        name=name,
        command=command,
        ray=ray,
        ray_autoscale=ray_autoscale,
        ray_resources=ray_resources,
        model_spec=model_spec,
        server_metrics=server_metrics,
        engine_options=engine_options,
    )
    return run_with(args, progress)


def run_with(args: RunArgs, progress: ProgressHook | None = None) -> Run:
    """:func:`run` from a :class:`RunArgs` record."""
    from perfscope.api.results import Run, load_run

    p = plan(args)
    outcome = execute(p, progress)
    if outcome.status != "complete":
        raise EngineError(
            f"the run on {p.options.engine} {outcome.status}: {outcome.error} "
            f"(what was captured is in {outcome.path})"
        )
    # The run as capture read it once, and its summary as analysed: no second read of the
    # directory, no second conversion of the summary.
    if outcome.stored is None:
        return load_run(outcome.path)
    return Run(outcome.stored, outcome.summary)


# --------------------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Sweep:
    """A finished sweep: one stored run per offered load, and the curve's summary.

    Attributes:
        kind: ``"rate"`` (requests per second, open loop) or ``"concurrency"`` (users).
        summary: the sweep summary as written to ``path`` (``points``, ``knee``,
            ``max_goodput_rate`` or ``max_goodput_concurrency``, ``slos``, ``probe``).
        path: the sweep's JSON file, ``<runs dir>/sweeps/<stamp>-<name>.json``.
        runs: the point runs' directories, in offered-load order.
        failed: how many point runs did not complete.
    """

    kind: str
    summary: SweepSummary
    path: Path
    runs: tuple[Path, ...]
    failed: int

    @property
    def points(self) -> list[SweepPoint]:
        """Per point: ``offered`` load, ``req_s``, ``output_tok_s``, latency percentiles
        (seconds), SLO ``attainment`` (fraction), ``failed`` requests, ``run``."""
        return list(self.summary.points)

    @property
    def knee(self) -> SweepKnee | None:
        """The last point before latency climbs (its ``point`` and ``metric``), or ``None``."""
        return self.summary.knee

    @property
    def max_goodput(self) -> float | None:
        """The highest offered load whose SLO attainment stays >= 90% (``None`` without
        SLOs or when no point reaches it)."""
        value = self.summary.max_goodput
        return None if value is None else float(value)


def auto_rates(saturation_req_s: float, points: int) -> list[float]:
    """``points`` rates spread evenly from 1/points of the saturation throughput to 1.2x it
    (the last points push past saturation so the curve shows the knee)."""
    if points < 2:
        raise UsageError("--points must be at least 2")
    top = 1.2 * saturation_req_s
    return [round(top * (i + 1) / points, 3) for i in range(points)]


_SWEEP_SETS = ("mode", "rate", "concurrency", "progress", "requests", "name", "engine_options")


def sweep(
    engine: EngineLike,
    *,
    rates: Sequence[float] | Literal["auto"] | None = None,
    concurrencies: Sequence[int] | None = None,
    points: int = 6,
    probe_requests: int | None = None,
    knee_metric: str = "e2e_p50",
    requests: int | None = None,
    slos: Mapping[str, float | str] | None = None,
    runs_dir: str | Path | None = None,
    name: str = "sweep",
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> Sweep:
    """One run per offered load, then the throughput-latency curve: its knee and the max
    goodput rate (the highest rate whose SLO attainment stays >= 90%).

    ::

        s = perfscope.sweep("openai:http://127.0.0.1:8000/v1", rates=[2, 4, 8],
                            slos={"ttft": "500ms"}, model="my-model")
        print(s.knee, s.max_goodput)

    Args:
        engine: an engine URI or a callable that yields tokens (a fresh engine per point).
        rates: requests per second per point, or ``"auto"`` (the default): probe the
            saturation throughput with a batch of requests first, then ``points`` rates up
            to 1.2x it.
        concurrencies: closed-loop users per point (instead of ``rates``).
        points: points of an automatic sweep (at least 2).
        probe_requests: requests of the saturation probe (default max(16, requests)).
        knee_metric: latency the knee is found on: ``e2e_p50``, ``e2e_p99``,
            ``ttft_p50``, ``ttft_p99``, ``tpot_p50``, ``tpot_p99``.
        requests: measured requests per point (default 32).
        slos: as in :func:`run`; they give each point's attainment and the max goodput.
        runs_dir: root folder of the runs and of ``sweeps/``.
        name: name prefix of the point runs and of the sweep file.
        log: receives one line per step (``"sweep: rate 4 ..."``); default: silent.
        **options: any other keyword of :func:`run` (workload, engine, engine-specific).

    Raises:
        perfscope.errors.UsageError: bad arguments, or the saturation probe failed.
    """
    from perfscope.profiler.engines.base import Engine

    if isinstance(engine, Engine):
        raise UsageError(
            "an Engine object serves one run (it is closed afterwards); a sweep needs an "
            "engine URI or a callable"
        )
    clash = sorted(set(options) & set(_SWEEP_SETS))
    if clash:
        raise UsageError(f"sweep() sets {', '.join(clash)} itself for each point")
    run_fields = {k: v for k, v in options.items() if k in _RUN_ARG_NAMES}
    extra = {k: v for k, v in options.items() if k not in _RUN_ARG_NAMES}
    base = RunArgs(
        engine=engine,
        requests=requests,
        slos=slos,
        runs_dir=runs_dir,
        engine_options=extra,
        default_requests=DEFAULT_SWEEP_REQUESTS,
        **run_fields,
    )
    return sweep_with(
        base,
        rates=rates,
        concurrencies=concurrencies,
        points=points,
        probe_requests=probe_requests,
        knee_metric=knee_metric,
        name=name,
        log=log,
    )


def sweep_with(
    base: RunArgs,
    *,
    rates: Sequence[float] | Literal["auto"] | None = None,
    concurrencies: Sequence[int] | None = None,
    points: int = 6,
    probe_requests: int | None = None,
    knee_metric: str = "e2e_p50",
    name: str = "sweep",
    log: Callable[[str], None] | None = None,
) -> Sweep:
    """:func:`sweep` from a :class:`RunArgs` record of the per-point options."""
    from perfscope.analysis.catalogue import format_number
    from perfscope.analysis.sweep import SweepProbe, summarize_sweep, sweep_point
    from perfscope.profiler.store import default_runs_root, write_json_atomic

    say = log or (lambda line: None)
    if rates is not None and concurrencies is not None:
        raise UsageError("give either rates or concurrencies, not both")
    # Every option is checked before the first run (a probe can take minutes).
    plan(replace(base, name=name))
    slos = slo_seconds(base.slos)
    probe: SweepProbe | None = None
    if concurrencies is not None:
        kind = "concurrency"
        loads = [float(_whole(int(c), base.arg("concurrency"), 1)) for c in concurrencies]
    else:
        kind = "rate"
        chosen = "auto" if rates is None else rates
        if isinstance(chosen, str):
            if chosen != "auto":
                raise UsageError(f"rates must be numbers or 'auto', got {chosen!r}")
            points = _whole(points, "points", 2)
            n_probe = probe_requests or max(16, base.requests or base.default_requests)
            say(f"sweep: probing saturation throughput with {n_probe} requests at once")
            out = execute(plan(replace(base, requests=n_probe, name=f"{name}-probe")))
            sat = out.summary.throughput.req_s
            if out.status != "complete" or not sat:
                raise UsageError(
                    f"the saturation probe failed ({out.error or 'no completed requests'}); "
                    f"see {out.path}, or give --rates explicitly"
                )
            probe = SweepProbe(run=str(out.path), req_s=sat)
            loads = auto_rates(float(sat), points)
        else:
            loads = [_positive(r, base.arg("rate")) for r in chosen]
    if not loads:
        raise UsageError("a sweep needs at least one rate or concurrency")
    point_rows = []
    failed = 0
    runs: list[Path] = []
    for x in loads:
        label = f"c{int(x)}" if kind == "concurrency" else f"r{x:g}"
        point = replace(
            base,
            mode="online",
            rate=x if kind == "rate" else None,
            concurrency=int(x) if kind == "concurrency" else None,
            name=f"{name}-{label}",
        )
        say(f"sweep: {kind} {format_number(x)} ...")
        out = execute(plan(point))
        if out.status != "complete":
            failed += 1
        runs.append(out.path)
        point_rows.append(sweep_point(x, out.summary, str(out.path)))
    root = Path(base.runs_dir) if base.runs_dir is not None else default_runs_root()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = root / "sweeps" / f"{stamp}-{name}.json"
    summary = replace(
        summarize_sweep(kind, point_rows, slos, knee_metric),
        probe=probe,
        engine=_engine_of(runs[0]) or _engine_factory(base.engine)[0],
        path=str(path),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, summary.to_dict())
    return Sweep(kind=kind, summary=summary, path=path, runs=tuple(runs), failed=failed)


def _engine_of(run_dir: Path) -> str | None:
    """The engine URI a run's manifest records (it may be normalised by the engine)."""
    from perfscope.analysis.catalogue import value_at
    from perfscope.profiler.store import read_manifest

    try:
        uri = value_at(read_manifest(run_dir), "engine.uri")
    except RunNotFoundError:
        return None
    return str(uri) if uri else None
