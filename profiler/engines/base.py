"""The engine contract: one protocol, an inbox of submissions, and a registry by URI scheme.

An engine is anything that takes requests from an :class:`Inbox` and reports their tokens
(and, for local engines, their forward passes) to a :class:`~perfscope.profiler.recorder.Recorder`.
The driver decides *when* requests arrive; the engine decides how to batch them.

Two shapes of engine exist:

- batching engines (``reference``, ``hf``) drain the inbox between forward passes and run
  their own scheduler;
- per-request engines (``python:``, ``openai:``) serve each request independently; they
  subclass :class:`PerRequestEngine` and implement only :meth:`PerRequestEngine.generate`.
"""

from __future__ import annotations

import difflib
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, overload, runtime_checkable

from perfscope.errors import EngineNotFoundError, UsageError
from perfscope.profiler.recorder import Recorder, RequestHandle
from perfscope.profiler.records import RequestSpec

__all__ = [
    "Engine",
    "EngineInfo",
    "EngineOptions",
    "Inbox",
    "PerRequestEngine",
    "Submission",
    "create_engine",
    "option_choice",
    "option_float",
    "option_int",
    "register_engine",
]


@dataclass
class EngineInfo:
    """What the manifest says about the engine.

    Attributes:
        uri: the engine URI as given (``reference``, ``python:mod:fn``, ...).
        kind: the registry scheme.
        model: ``ModelSpec`` fields as a dict when the engine knows its model exactly.
        device: where it runs (``cpu``, ``cuda:0``, a server URL).
        dtype: activation dtype name, when known.
        config: everything else worth keeping (scheduler, batch size, seed, ...).
    """

    uri: str
    kind: str
    model: dict[str, Any] | None = None
    device: str | None = None
    dtype: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "kind": self.kind,
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "config": self.config,
        }


@dataclass(frozen=True)
class EngineOptions:
    """Options from the command line that engines may use; each engine ignores the rest.

    Attributes:
        batch_size: most sequences decoded together (batching engines).
        scheduler: ``continuous`` or ``static`` (batching engines).
        batch_timeout_s: static scheduling only: how long the oldest waiting request may
            wait for its batch to fill before the batch starts anyway (0 = start at once).
        device: ``cpu``, ``cuda``, ``cuda:1``; ``None`` = CUDA when available, else CPU.
        dtype: ``float32|bfloat16|float16``; ``None`` = the engine's default.
        seed: seeds weights and sampling.
        model_preset: named shape of the reference model.
        model_overrides: explicit shape fields (``n_layers``, ``hidden_size``, ...).
        stop_on_eos: let sequences end early on the end-of-sequence token.
        max_seq_len: longest prompt + output the engine must hold (sizes KV caches).
        longest_request_tokens: prompt + output tokens of the workload's longest request,
            when the runner knows it (servers check it against their context length).
        extra: engine-specific options (``--engine-opt key=value``).
        request_timeout_s: longest a request may take from being sent to its end, in
            seconds (``--timeout``); ``None`` = no limit. Past it the request fails with a
            timeout error and the run goes on.
    """

    batch_size: int = 8
    scheduler: str = "continuous"
    batch_timeout_s: float = 0.0
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    model_preset: str | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    stop_on_eos: bool = False
    max_seq_len: int = 2048
    longest_request_tokens: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float | None = None


@dataclass
class Submission:
    """A request handed to the engine: what to run and where to report it."""

    spec: RequestSpec
    handle: RequestHandle


class Inbox:
    """Thread-safe queue from the driver to the engine, closed when no more will come."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Submission | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._drained_close = False

    def put(self, sub: Submission) -> None:
        if self._closed.is_set():
            raise RuntimeError("inbox is closed")
        self._q.put(sub)

    def close(self) -> None:
        """No more submissions will arrive."""
        if not self._closed.is_set():
            self._closed.set()
            self._q.put(None)

    @property
    def finished(self) -> bool:
        """Closed and every submission has been taken."""
        return self._drained_close

    def get(self, timeout_s: float | None = None) -> Submission | None:
        """Next submission, waiting up to ``timeout_s`` (None = forever); ``None`` when the
        inbox is finished or the wait timed out (check :attr:`finished`)."""
        if self._drained_close:
            return None
        try:
            item = self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if item is None:
            self._drained_close = True
        return item

    def drain(self) -> list[Submission]:
        """Every submission available right now, without waiting."""
        out: list[Submission] = []
        while not self._drained_close:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._drained_close = True
            else:
                out.append(item)
        return out


@runtime_checkable
class Engine(Protocol):
    """What every engine adapter implements."""

    def info(self) -> EngineInfo:
        """Describe the engine for the manifest (called once, before serving)."""
        ...

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        """Run submissions from ``inbox`` until it is finished and all requests are done.

        Report each request on its ``handle`` (``sent``, ``tokens``, ``finish``) and, for
        local engines, each forward pass with ``recorder.step``. A failure of one request is
        recorded on its handle; an exception out of ``serve`` fails the run (the data
        recorded so far is kept).
        """
        ...

    def close(self) -> None:
        """Release resources (models, sessions). Safe to call more than once."""
        ...


class PerRequestEngine(ABC):
    """Base for engines that serve each request on its own (callables, HTTP servers).

    Subclasses implement :meth:`generate`; ``serve`` runs each submission in a worker thread
    as soon as the driver submits it, up to ``max_workers`` at once.
    """

    max_workers: int = 512
    #: Per-request limit in seconds (from ``EngineOptions.request_timeout_s``); None = none.
    request_timeout_s: float | None = None

    @abstractmethod
    def info(self) -> EngineInfo: ...

    @abstractmethod
    def generate(self, spec: RequestSpec, handle: RequestHandle) -> None:
        """Serve one request: call ``handle.tokens(n)`` per chunk as it arrives.

        ``handle.sent()`` has already been called; raising marks the request failed with
        the exception's text (the run goes on); ``finish`` is called for you.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Nothing to release by default."""

    def _run_one(self, sub: Submission) -> None:
        sub.handle.sent()
        if self.request_timeout_s is not None:
            self._run_with_timeout(sub, self.request_timeout_s)
            return
        self._generate_and_finish(sub)

    def _generate_and_finish(self, sub: Submission) -> None:
        try:
            self.generate(sub.spec, sub.handle)
        except Exception as exc:  # one request failing must not end the run
            sub.handle.finish(error=_error_text(exc))
        else:
            sub.handle.finish()

    def _run_with_timeout(self, sub: Submission, timeout_s: float) -> None:
        """Serve ``sub`` in a daemon thread and give up on it after ``timeout_s``: a hung
        engine call cannot be cancelled from Python, but the request fails, its later
        chunks are ignored and the run (and the process's exit) does not wait for it."""
        worker = threading.Thread(
            target=self._generate_and_finish,
            args=(sub,),
            name=f"perfscope-req-{sub.spec.request_id}",
            daemon=True,
        )
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            sub.handle._recorder.expire(
                sub.spec.request_id, f"timeout: no end after {timeout_s:g} s (--timeout)"
            )

    def serve(self, inbox: Inbox, recorder: Recorder) -> None:
        pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="perfscope-req")
        try:
            while True:
                sub = inbox.get(timeout_s=0.5)  # a timeout keeps Ctrl-C responsive
                if sub is None:
                    if inbox.finished:
                        break
                    continue
                pool.submit(self._run_one, sub)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


#: Keys the capture stage itself sets for every engine (the workload's prompt salt).
CAPTURE_OPTIONS = ("prompt_salt",)


def check_options(
    extra: Mapping[str, str],
    known: Iterable[str],
    engine: str,
    flags: Mapping[str, str] | None = None,
) -> None:
    """Refuse ``--engine-opt`` keys the engine does not read, in one line that names them,
    the closest known key (difflib, ratio >= 0.6) and every key it accepts: an option
    silently ignored makes a run that measured something else than the user asked.
    ``flags`` maps keys that are command-line flags instead (``preset`` -> ``--model-preset``)
    to that flag, which the error then names."""
    names = sorted(set(known))
    unknown = sorted(k for k in extra if k not in names and k not in CAPTURE_OPTIONS)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
        if flags and key in flags:
            hints.append(f"{key} -> the {flags[key]} flag")
        elif close:
            hints.append(f"{key} -> {close[0]}?")
    hint = f" (did you mean {', '.join(hints)})" if hints else ""
    raise UsageError(
        f"--engine-opt {', '.join(unknown)}: not an option of the {engine} engine{hint}; "
        f"it reads {', '.join(names)}"
    )


def option_int(extra: dict[str, str], key: str) -> int | None:
    """``--engine-opt KEY=N`` as a whole number >= 1 (None when not given); anything else is
    a one-line :class:`UsageError` naming the option."""
    text = extra.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"--engine-opt {key}= must be a whole number >= 1, got {text!r}")
    return value


def option_float(extra: dict[str, str], key: str, default: float) -> float:
    """``--engine-opt KEY=X`` as a number > 0 (``default`` when not given)."""
    text = extra.get(key)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"--engine-opt {key}= must be a number > 0, got {text!r}")
    return value


@overload
def option_choice(
    extra: dict[str, str], key: str, choices: tuple[str, ...], default: str
) -> str: ...
@overload
def option_choice(
    extra: dict[str, str], key: str, choices: tuple[str, ...], default: None = None
) -> str | None: ...
def option_choice(
    extra: dict[str, str], key: str, choices: tuple[str, ...], default: str | None = None
) -> str | None:
    """``--engine-opt KEY=WORD``, case-insensitive, one of ``choices`` (``default`` when not
    given)."""
    text = extra.get(key, default)
    if text is None:
        return None
    text = text.strip().lower()
    if text not in choices:
        raise UsageError(f"--engine-opt {key}= must be one of {', '.join(choices)}, got {text!r}")
    return text


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    return (f"{name}: {text}" if text else f"{name} (no message)")[:300]


EngineFactory = Callable[[str, EngineOptions], Engine]
_REGISTRY: dict[str, EngineFactory] = {}


def register_engine(scheme: str) -> Callable[[EngineFactory], EngineFactory]:
    """Register ``factory(uri, options) -> Engine`` for URIs ``scheme`` or ``scheme:...``."""

    def deco(factory: EngineFactory) -> EngineFactory:
        _REGISTRY[scheme] = factory
        return factory

    return deco


#: Built-in engine modules by URI scheme: a run imports only its own engine's module, so an
#: ``openai:`` run never imports torch (the reference engine's dependency).
_BUILTIN_MODULES: dict[str, str] = {
    "reference": "perfscope.profiler.engines.reference",
    "hf": "perfscope.profiler.engines.hf",
    "python": "perfscope.profiler.engines.python_callable",
    "vllm": "perfscope.profiler.engines.vllm_engine",
    "openai": "perfscope.profiler.engines.openai",
}


def _load_builtin_engines(scheme: str | None = None) -> None:
    """Import the built-in engine module for ``scheme`` (all of them when None or unknown)."""
    import importlib

    wanted = [scheme] if scheme in _BUILTIN_MODULES else list(_BUILTIN_MODULES)
    for name in wanted:
        if name in _REGISTRY:
            continue
        try:
            importlib.import_module(_BUILTIN_MODULES[name])
        except ImportError as exc:
            if name != "openai":
                raise
            # optional dependency (aiohttp): fail only when openai: is used
            _missing = str(exc)

            def _openai_missing(uri: str, options: EngineOptions, _m: str = _missing) -> Engine:
                raise UsageError(
                    f"the openai engine needs the 'openai' extra ({_m}): "
                    "pip install 'perfscope[openai]'"
                )

            _REGISTRY.setdefault("openai", _openai_missing)


def create_engine(uri: str, options: EngineOptions | None = None) -> Engine:
    """Build the engine for ``uri`` (``reference``, ``python:module:attr``, ...)."""
    scheme = uri.split(":", 1)[0].strip().lower() if uri else ""
    _load_builtin_engines(scheme)
    factory = _REGISTRY.get(scheme)
    if factory is None:
        known = ", ".join(f"{s}" if s == "reference" else f"{s}:..." for s in sorted(_REGISTRY))
        raise EngineNotFoundError(
            f"unknown engine {uri!r}: use one of {known} "
            "(e.g. 'reference' or 'python:mypkg.engine:generate')"
        )
    try:
        return factory(uri, options or EngineOptions())
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(f"engine {uri!r}: {exc}") from exc
