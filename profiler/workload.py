"""Workloads: which requests to send (lengths, prompts), reproducibly from a seed."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfscope.errors import WorkloadError
from perfscope.profiler.records import RequestSpec

__all__ = [
    "MAX_LENGTH",
    "MAX_REQUESTS",
    "LengthDist",
    "TraceRow",
    "WorkloadConfig",
    "build_workload",
    "load_trace",
    "parse_length",
    "read_trace",
    "with_fresh_salt",
]

#: Most requests (warmup included) one workload may plan; each costs a few hundred bytes
#: before anything is sent, so a mistyped count is refused instead of exhausting memory.
MAX_REQUESTS = 10_000_000
#: Longest prompt or output length (tokens) a distribution may produce: far beyond any
#: context window, and small enough that lengths and KV-cache sizes stay exact integers.
MAX_LENGTH = 10_000_000


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``constant``, ``uniform`` (inclusive) or ``normal``
    (rounded, clipped to at least 1).

    Attributes:
        kind: ``constant | uniform | normal``.
        a: the value (constant), the low end (uniform) or the mean (normal).
        b: the high end (uniform) or the standard deviation (normal); unused for constant.
    """

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer lengths, each at least 1."""
        if self.kind == "constant":
            out = np.full(n, self.a)
        elif self.kind == "uniform":
            out = rng.integers(int(self.a), int(self.b) + 1, size=n)
        else:
            # Clipped to the declared range (mean + 6 sigma) so a sample never exceeds ``max``.
            out = np.clip(np.rint(rng.normal(self.a, self.b, size=n)), 1, self.max)
        result: np.ndarray = np.maximum(out, 1).astype(np.int64)
        return result

    @property
    def max(self) -> int:
        """Largest value it can produce (normal: mean + 6 sigma)."""
        if self.kind == "constant":
            return int(self.a)
        if self.kind == "uniform":
            return int(self.b)
        return max(1, math.ceil(self.a + 6 * self.b))

    def __str__(self) -> str:
        if self.kind == "constant":
            return str(int(self.a))
        return f"{self.kind}:{self.a:g}:{self.b:g}"


def parse_length(text: str | int, what: str = "length") -> LengthDist:
    """Parse ``128``, ``uniform:64:256`` or ``normal:128:32``."""
    if isinstance(text, int):
        text = str(text)
    parts = text.strip().lower().split(":")
    too_long = f"{what} {text!r}: at most {MAX_LENGTH:,} tokens"
    try:
        if len(parts) == 1:
            value = int(parts[0])
            if value < 1:
                raise WorkloadError(f"{what} must be at least 1 token, got {value}")
            if value > MAX_LENGTH:
                raise WorkloadError(too_long)
            return LengthDist("constant", value)
        kind, nums = parts[0], [float(p) for p in parts[1:]]
    except ValueError:
        raise WorkloadError(
            f"cannot read {what} {text!r}: use a number (128), 'uniform:LOW:HIGH' or "
            "'normal:MEAN:STD'"
        ) from None
    if kind == "uniform" and len(nums) == 2:
        low, high = nums
        if not (1 <= low <= high) or math.isinf(high) or low != int(low) or high != int(high):
            raise WorkloadError(f"{what} {text!r}: uniform needs whole numbers 1 <= LOW <= HIGH")
        if high > MAX_LENGTH:
            raise WorkloadError(too_long)
        return LengthDist("uniform", low, high)
    if kind == "normal" and len(nums) == 2:
        mean, std = nums
        if not (1 <= mean < math.inf and 0 <= std < math.inf):
            raise WorkloadError(f"{what} {text!r}: normal needs MEAN >= 1 and STD >= 0")
        if mean + 6 * std > MAX_LENGTH:
            raise WorkloadError(f"{too_long} (MEAN + 6 STD)")
        return LengthDist("normal", mean, std)
    raise WorkloadError(
        f"cannot read {what} {text!r}: use a number (128), 'uniform:LOW:HIGH' or 'normal:MEAN:STD'"
    )


@dataclass(frozen=True)
class WorkloadConfig:
    """What to send.

    Attributes:
        requests: measured requests (``None`` with a prompts file = one per line).
        prompt_len: prompt length distribution in tokens (ignored for file prompts that
            carry their own length).
        output_len: output length distribution in tokens.
        prompts_file: JSONL file, one object per line with ``prompt`` (text) or
            ``prompt_tokens`` (int) or ``prompt_token_ids`` (list), and optionally
            ``output_tokens`` / ``max_tokens``.
        warmup: extra requests run before the measured ones and excluded from statistics.
        seed: seeds lengths (and, in engines, prompt ids).
        dataset: prompt text source (see :mod:`perfscope.profiler.datasets`): ``synthetic``
            (random words of the target token lengths), ``sharegpt`` (conversations in
            ``dataset_path``) or ``shared-prefix`` (``prefix_len`` shared tokens, then
            ``prompt_len`` unique ones); ``None`` = token counts only (local engines).
        dataset_path: the ShareGPT file.
        prefix_len: shared prefix tokens (shared-prefix).
        prefix_groups: distinct shared prefixes, used in turn (shared-prefix).
        tokenizer: ``tokenizer.json`` (or its folder) for exact token lengths of text prompts.
        output_len_given: ``--output-len`` was given, so it wins over dataset reply lengths.
        fresh_prompts: each run draws a new ``prompt_salt`` (the runner does), so no server
            can serve a rerun's generated prompts from its prefix cache. False: the prompts
            repeat exactly for a seed (then the server may serve them from cache).
        prompt_salt: the salt of this run's generated prompt text (None: none).
        trace_file: a production trace to replay (JSONL, see :func:`load_trace`): arrival
            times, prompt and output lengths and optional prefix-block hash ids.
        trace_block_tokens: tokens per prefix hash block of the trace (Mooncake: 512).
        turns: user turns per conversation (``multi-turn`` dataset).
        server_tokenizer: root URL of a server whose ``/tokenize`` sizes generated prompts
            exactly when no ``tokenizer`` is given (None: estimate, one word a token).
    """

    requests: int | None = 32
    prompt_len: LengthDist = LengthDist("constant", 128)
    output_len: LengthDist = LengthDist("constant", 64)
    prompts_file: Path | None = None
    warmup: int = 0
    seed: int = 0
    dataset: str | None = None
    dataset_path: Path | None = None
    prefix_len: int = 0
    prefix_groups: int = 1
    tokenizer: str | None = None
    output_len_given: bool = False
    fresh_prompts: bool = True
    prompt_salt: int | None = None
    trace_file: Path | None = None
    trace_block_tokens: int = 512
    turns: int = 3
    server_tokenizer: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "prompt_len": str(self.prompt_len),
            "output_len": str(self.output_len),
            "prompts_file": str(self.prompts_file) if self.prompts_file else None,
            "warmup": self.warmup,
            "seed": self.seed,
            "dataset": self.dataset,
            "dataset_path": str(self.dataset_path) if self.dataset_path else None,
            "prefix_len": self.prefix_len if self.dataset == "shared-prefix" else None,
            "prefix_groups": self.prefix_groups if self.dataset == "shared-prefix" else None,
            "tokenizer": self.tokenizer,
            "prompt_salt": self.prompt_salt,
            "trace": str(self.trace_file) if self.trace_file else None,
            "turns": self.turns if self.dataset == "multi-turn" else None,
            "server_tokenizer": self.server_tokenizer,
        }


def _read_prompts(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        raise WorkloadError(f"prompts file {str(path)!r} does not exist")
    rows: list[dict[str, object]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read prompts file {str(path)!r}: {exc}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if isinstance(obj, str):
            obj = {"prompt": obj}
        if not isinstance(obj, dict) or not (
            "prompt" in obj or "prompt_tokens" in obj or "prompt_token_ids" in obj
        ):
            raise WorkloadError(
                f"{path}:{lineno}: each line needs 'prompt', 'prompt_tokens' or 'prompt_token_ids'"
            )
        rows.append(obj)
    if not rows:
        raise WorkloadError(f"prompts file {str(path)!r} has no prompts")
    return rows


def _spec_from_row(
    rid: int, row: dict[str, object], out_len: int, warm: bool, where: str
) -> RequestSpec:
    try:
        ids = row.get("prompt_token_ids")
        prompt = row.get("prompt")
        if ids is not None:
            token_ids = tuple(int(x) for x in ids)  # type: ignore[attr-defined]
            n_prompt = len(token_ids)
        else:
            token_ids = None
            n_prompt = (
                int(str(row["prompt_tokens"]))
                if "prompt_tokens" in row
                else len(
                    str(prompt).encode("utf-8")  # byte-level count until an engine recounts
                )
            )
        raw_out = row.get("output_tokens", row.get("max_tokens", out_len))
        n_out = int(str(raw_out))
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: bad field ({exc})") from None
    if n_prompt < 1 or n_out < 1:
        raise WorkloadError(f"{where}: prompt and output lengths must be at least 1 token")
    return RequestSpec(
        request_id=rid,
        prompt_tokens=n_prompt,
        max_output_tokens=n_out,
        prompt=None if prompt is None else str(prompt),
        prompt_token_ids=token_ids,
        is_warmup=warm,
    )


def with_fresh_salt(cfg: WorkloadConfig) -> WorkloadConfig:
    """``cfg`` with a newly drawn ``prompt_salt`` when it asks for fresh prompts."""
    if not cfg.fresh_prompts or cfg.prompt_salt is not None:
        return cfg
    import dataclasses
    import secrets

    return dataclasses.replace(cfg, prompt_salt=secrets.randbits(31))


def build_workload(cfg: WorkloadConfig) -> list[RequestSpec]:
    """The warmup requests (ids ``0..warmup-1``) followed by the measured ones."""
    if cfg.warmup < 0:
        raise WorkloadError(f"--warmup must be 0 or more, got {cfg.warmup}")
    planned = cfg.warmup + (cfg.requests or 0)
    if planned > MAX_REQUESTS:
        raise WorkloadError(
            f"{planned:,} requests (warmup included) is more than the {MAX_REQUESTS:,} one run "
            "may plan: split the load into several runs or bound it with --duration"
        )
    if cfg.trace_file is not None:
        return load_trace(cfg)
    if cfg.dataset is not None and cfg.prompts_file is None:
        from perfscope.profiler.datasets import build_dataset_specs, load_tokenizer_for

        return build_dataset_specs(
            cfg.dataset,
            n=cfg.requests,
            warmup=cfg.warmup,
            prompt_lens=cfg.prompt_len,
            output_lens=cfg.output_len,
            seed=cfg.seed,
            path=cfg.dataset_path,
            prefix_len=cfg.prefix_len,
            prefix_groups=cfg.prefix_groups,
            tokenizer=load_tokenizer_for(cfg.tokenizer, cfg.server_tokenizer),
            output_len_given=cfg.output_len_given,
            salt=cfg.prompt_salt,
            turns=cfg.turns,
        )
    rng = np.random.default_rng(cfg.seed)
    if cfg.prompts_file is not None:
        rows = _read_prompts(cfg.prompts_file)
        n = cfg.requests if cfg.requests is not None else len(rows)
    else:
        rows = []
        n = cfg.requests if cfg.requests is not None else 32
    if n < 1:
        raise WorkloadError(f"--requests must be at least 1, got {n}")
    total = cfg.warmup + n
    prompt_lens = cfg.prompt_len.sample(rng, total)
    output_lens = cfg.output_len.sample(rng, total)
    specs: list[RequestSpec] = []
    for i in range(total):
        warm = i < cfg.warmup
        if rows:
            j = i % len(rows)
            specs.append(
                _spec_from_row(
                    i, rows[j], int(output_lens[i]), warm, f"{cfg.prompts_file}: prompt {j + 1}"
                )
            )
        else:
            specs.append(
                RequestSpec(
                    request_id=i,
                    prompt_tokens=int(prompt_lens[i]),
                    max_output_tokens=int(output_lens[i]),
                    is_warmup=warm,
                )
            )
    return specs


@dataclass(frozen=True)
class TraceRow:
    """One request of a production trace.

    Attributes:
        arrival_s: arrival time, seconds from the trace's start.
        input_tokens / output_tokens: prompt and output lengths.
        hash_ids: prefix blocks: requests sharing a leading run of ids share that prefix
            (each id stands for ``trace_block_tokens`` tokens; the last may be partial).
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _first(obj: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in obj and obj[k] is not None:
            return obj[k]
    return None


def read_trace(path: Path) -> list[TraceRow]:
    """Rows of a JSONL trace, sorted by arrival.

    Each line: ``timestamp`` (ms, as the public Mooncake traces) or ``arrival_s`` /
    ``timestamp_s`` (s); ``input_length`` (or ``input_tokens`` / ``prompt_tokens``);
    ``output_length`` (or ``output_tokens`` / ``max_tokens``); optional ``hash_ids``.
    """
    if not path.is_file():
        raise WorkloadError(f"trace file {str(path)!r} does not exist")
    rows: list[TraceRow] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{where}: each line must be a JSON object")
        t_ms = _first(obj, "timestamp")
        t_s = _first(obj, "arrival_s", "timestamp_s")
        inp = _first(obj, "input_length", "input_tokens", "prompt_tokens")
        out = _first(obj, "output_length", "output_tokens", "max_tokens")
        try:
            arrival = float(t_s) if t_s is not None else float(t_ms) / 1e3
            n_in, n_out = int(inp), int(out)
            ids = tuple(int(h) for h in obj.get("hash_ids") or ())
        except (TypeError, ValueError):
            raise WorkloadError(
                f"{where}: needs 'timestamp' (ms) or 'arrival_s', 'input_length' and "
                "'output_length' (numbers), and 'hash_ids' a list of integers if given"
            ) from None
        if n_in < 1 or n_out < 1 or not math.isfinite(arrival) or arrival < 0:
            raise WorkloadError(f"{where}: lengths must be >= 1 and the time >= 0")
        rows.append(TraceRow(arrival, n_in, n_out, ids))
    if not rows:
        raise WorkloadError(f"trace file {str(path)!r} has no requests")
    rows.sort(key=lambda r: r.arrival_s)
    return rows


def load_trace(cfg: WorkloadConfig) -> list[RequestSpec]:
    """Requests that replay ``cfg.trace_file``: its arrival times (each phase from its first
    request), lengths and, with prompt text (``cfg.dataset`` set), prompts that share a
    prefix exactly where the trace's hash ids do (one text per block id, salted per run)."""
    assert cfg.trace_file is not None
    rows = read_trace(cfg.trace_file)
    n = cfg.requests if cfg.requests is not None else len(rows) - cfg.warmup
    total = min(len(rows), cfg.warmup + max(n, 0))
    if total <= cfg.warmup:
        raise WorkloadError(
            f"the trace has {len(rows)} requests: not enough for {cfg.warmup} warmup and "
            "at least one measured"
        )
    text = cfg.dataset is not None
    tokenizer = None
    if text:
        from perfscope.profiler.datasets import load_tokenizer_for, synthetic_text

        tokenizer = load_tokenizer_for(cfg.tokenizer, cfg.server_tokenizer)
    block = max(1, cfg.trace_block_tokens)
    blocks: dict[tuple[int, int, int], str] = {}
    salt = [cfg.prompt_salt] if cfg.prompt_salt is not None else []

    def block_text(kind: int, h: int, k: int) -> str:
        """Text of ``k`` tokens for hash block ``h`` (kind 0) or unique to request ``h`` (1)."""
        key = (kind, h, k)
        if key not in blocks:
            rng = np.random.default_rng([cfg.seed, kind, h, k, *salt])
            blocks[key] = synthetic_text(k, rng, tokenizer)[0]
        return blocks[key]

    specs: list[RequestSpec] = []
    for i, row in enumerate(rows[:total]):
        prompt = None
        if text:
            if row.hash_ids:
                parts, left = [], row.input_tokens
                for h in row.hash_ids:
                    k = min(block, left)
                    if k < 1:
                        break
                    parts.append(block_text(0, h, k))
                    left -= k
                if left > 0:
                    parts.append(block_text(1, i, left))  # beyond the hashed blocks: unique
                prompt = " ".join(parts)
            else:
                prompt = block_text(1, i, row.input_tokens)
        specs.append(
            RequestSpec(
                request_id=i,
                prompt_tokens=row.input_tokens,
                max_output_tokens=row.output_tokens,
                prompt=prompt,
                is_warmup=i < cfg.warmup,
                arrival_s=row.arrival_s,
            )
        )
    return specs
