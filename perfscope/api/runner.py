"""``perfscope run`` as a library call: plan, engine, hardware, capture, analysis.

The front door's part of a run is short (docs/architecture.md): the capture stage plans the
run (:func:`~perfscope.profiler.capture.plan_capture`: bad input refused before anything is
written), the engine is created and its model completed from an HF config (analysis's
``ModelSpec``), the device resolved (``hwdb``), then
:func:`~perfscope.profiler.capture.capture` runs and stores it (durability: see
:mod:`perfscope.profiler.capture`) and the run as captured, read back once, is analysed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfscope import __version__
from perfscope.analysis import Summary
from perfscope.api.analyze import analyze_stored
from perfscope.errors import PerfscopeError, UsageError
from perfscope.hwdb import load_database, resolve_hardware
from perfscope.jsontypes import JsonObject
from perfscope.profiler.capture import (
    FLUSH_INTERVAL_S,
    ProgressHook,
    RunOptions,
    capture,
    host_info,
    plan_capture,
)
from perfscope.profiler.engines.base import Engine, EngineInfo, EngineOptions, create_engine
from perfscope.profiler.signals import Terminated, stop_signals_as_interrupt, stop_signals_deferred
from perfscope.profiler.store import StoredRun

__all__ = [
    "FLUSH_INTERVAL_S",
    "ProgressHook",
    "RunOptions",
    "RunOutcome",
    "Terminated",
    "execute_run",
    "host_info",
    "stop_signals_as_interrupt",
]


@dataclass
class RunOutcome:
    """Where the run went and how it ended (``complete``, ``interrupted``, ``failed``)."""

    path: Path
    status: str
    summary: Summary
    error: str | None = None
    succeeded: int = -1
    #: The run as stored, read once after capture (its ``summary`` the one just written):
    #: the caller's report reads this instead of the directory again.
    stored: StoredRun | None = None

    @property
    def exit_code(self) -> int:
        """What ``perfscope run`` exits with: 0 complete (some requests may have failed:
        they are reported), 1 interrupted or failed with data kept, 3 no measured request
        succeeded, 4 partial (a ``--ray`` load actor was lost: its in-flight requests were
        not measured)."""
        if self.status == "complete":
            return 0
        if self.status == "partial":
            return 4
        if self.status != "interrupted" and self.succeeded == 0:
            return 3
        return 1


def execute_run(
    opts: RunOptions,
    progress: ProgressHook | None = None,
    *,
    engine_factory: Callable[[str, EngineOptions], Engine] = create_engine,
) -> RunOutcome:
    """Run the workload on the engine and store the run; raises UsageError on bad input
    before anything is written. An engine failure or Ctrl-C still leaves a readable run
    (status ``failed`` / ``interrupted``) with everything captured so far."""
    plan = plan_capture(opts, perfscope_version=__version__)
    _check_local_model(plan.options.engine)
    engine = engine_factory(plan.options.engine, plan.engine_options)
    try:
        info = _with_model(engine.info(), plan.engine_options)
        database = load_database()  # once per run: resolution here, projections later
        hardware = resolve_hardware(info.to_dict(), opts.hw, database=database)
    except BaseException:
        engine.close()
        raise
    captured = capture(plan, engine, hardware, info=info, progress=progress)
    with stop_signals_deferred():
        summary = analyze_stored(captured.stored, database=database)  # sets stored.summary
    return RunOutcome(
        path=captured.path,
        status=captured.status,
        summary=summary,
        error=captured.error,
        succeeded=captured.succeeded,
        stored=captured.stored,
    )


def _with_model(info: EngineInfo, eopts: EngineOptions) -> EngineInfo:
    """``info`` with its model (and a speculative draft's) read from a local HF
    config when the engine reports none: a server's model (``openai:``) is known from
    ``--engine-opt hf_config=PATH``."""
    hf_config = info.config.get("hf_config") or eopts.extra.get("hf_config")
    if info.model is None and hf_config:
        info.model = _model_from_hf_config(
            str(hf_config),
            info.dtype,
            mla_absorbed=bool(info.config.get("mla_absorbed", True)),
        )
    spec_cfg = info.config.get("speculative")
    if isinstance(spec_cfg, dict) and spec_cfg.get("draft_hf_config"):
        # hf: assisted generation: the draft's passes are costed with its own config.
        spec_cfg["draft_model"] = _model_from_hf_config(
            str(spec_cfg["draft_hf_config"]), info.dtype
        )
    return info


def _model_from_hf_config(
    path: str, dtype: str | None, *, mla_absorbed: bool = True
) -> JsonObject | None:
    """ModelSpec fields of a local HF model, in the dtype it runs in (logits: last position).

    ``mla_absorbed`` is the engine's own statement of how it runs multi-head latent
    attention: ``True`` for serving engines that absorb the up-projections (vLLM, SGLang),
    ``False`` for HF transformers, which expands the latent for every attended token.
    """
    from dataclasses import replace

    from perfscope.analysis.modelspec import ModelSpec

    try:
        spec = ModelSpec.from_hf_config(path)
    except PerfscopeError:
        return None
    if spec.is_mla and spec.mla_absorbed != mla_absorbed:
        spec = replace(spec, mla_absorbed=mla_absorbed)
    if dtype:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
        spec = spec.with_dtypes(weight_dtype=short, kv_dtype=short, act_dtype=short)
    return {**spec.to_dict(), "lm_head_all_positions": False}


def _check_local_model(engine: str) -> None:
    """Refuse a ``vllm:PATH`` model whose architecture the cost model does not know, before
    vLLM spends minutes starting: its roofline would have no model to measure against."""
    scheme, _, path = engine.partition(":")
    if scheme.strip().lower() != "vllm" or not (Path(path).expanduser() / "config.json").is_file():
        return  # the engine itself names a missing folder
    from perfscope.analysis.modelspec import ModelSpec

    try:
        ModelSpec.from_hf_config(Path(path).expanduser())
    except UsageError as exc:
        raise UsageError(
            f"vllm engine: perfscope cannot model {path}: {exc} (the roofline needs the "
            "model's shape)"
        ) from exc
