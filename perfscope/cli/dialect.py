"""Other benchmarks' flags (vLLM bench, guidellm, AIPerf) in perfscope's dialect.

A flag that means the same as one of perfscope's is accepted as an alias (:data:`ALIASES`,
rewritten before parsing); one that does not gets a one-line pointer to what perfscope does
instead (:data:`POINTERS`). docs/flags.md is the table for people; tests/test_cli_dialect.py
checks that the two agree.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ALIASES", "POINTERS", "Alias", "pointer_for", "rewrite_aliases", "suggest"]


@dataclass(frozen=True)
class Alias:
    """``flag`` from ``tool`` accepted for perfscope's ``ours`` on ``commands``."""

    flag: str
    ours: str
    tool: str
    commands: tuple[str, ...] = ("run", "sweep")


#: Same meaning, accepted as written. (vLLM bench's ``--num-prompts``, ``--request-rate``,
#: ``--max-concurrency``, ``--random-input-len`` and ``--random-output-len`` are perfscope's own
#: second spellings and need no rewriting.)
ALIASES: tuple[Alias, ...] = (
    Alias("--disable-tqdm", "--no-progress", "vLLM bench", ("run",)),
    Alias("--max-requests", "--requests", "guidellm"),
    Alias("--max-seconds", "--duration", "guidellm"),
    Alias("--processor", "--tokenizer", "guidellm"),
    Alias("--random-seed", "--seed", "guidellm, AIPerf"),
    Alias("--request-count", "--requests", "AIPerf"),
    Alias("--warmup-request-count", "--warmup", "AIPerf"),
    Alias("--synthetic-input-tokens-mean", "--prompt-len", "AIPerf"),
    Alias("--output-tokens-mean", "--output-len", "AIPerf"),
    Alias("--benchmark-duration", "--duration", "AIPerf"),
)

_ENGINE_URI = "give the server as the engine: perfscope run openai:http://HOST:PORT/v1"

#: Different meaning or no equivalent: what perfscope does instead (one line each).
POINTERS: dict[str, str] = {
    "--backend": "vLLM bench's --backend is the engine URI's scheme here: openai:URL, vllm:PATH, "
    "hf:PATH",
    "--base-url": f"vLLM bench's --base-url: {_ENGINE_URI}",
    "--host": f"vLLM bench's --host/--port: {_ENGINE_URI}",
    "--port": f"vLLM bench's --host/--port: {_ENGINE_URI}",
    "--target": f"guidellm's --target: {_ENGINE_URI}",
    "--url": f"AIPerf's --url: {_ENGINE_URI}",
    "--percentile-metrics": "perfscope always reports p50/p90/p95/p99 of TTFT, TPOT, ITL and "
    "E2E (perfscope show --json has every percentile): drop --percentile-metrics",
    "--metric-percentiles": "perfscope always reports p50/p90/p95/p99 of every latency metric: "
    "drop --metric-percentiles",
    "--goodput": "goodput SLOs are --slo METRIC=DURATION here, e.g. --slo ttft=200ms "
    "--slo tpot=50ms (repeatable)",
    "--save-result": "every run is stored (perfscope ls; --runs-dir picks the folder): drop "
    "--save-result",
    "--result-dir": "runs are stored under --runs-dir DIR",
    "--output-path": "runs are stored under --runs-dir DIR; perfscope export writes CSV/JSON",
    "--artifact-dir": "runs are stored under --runs-dir DIR",
    "--dataset-name": "prompt text is --dataset synthetic|sharegpt:FILE|shared-prefix",
    "--dataset-path": "a dataset file goes after its kind: --dataset sharegpt:FILE",
    "--data": "guidellm's --data: --prompt-len N --output-len N for synthetic prompts, "
    "--dataset sharegpt:FILE or --prompts FILE.jsonl for real ones",
    "--input-file": "AIPerf's --input-file: --prompts FILE.jsonl (one prompt per line) or "
    "--trace FILE for a timed trace",
    "--random-range-ratio": "length ranges are --prompt-len uniform:LOW:HIGH (or normal:MEAN:STD)",
    "--synthetic-input-tokens-stddev": "a spread of lengths is --prompt-len normal:MEAN:STD",
    "--output-tokens-stddev": "a spread of lengths is --output-len normal:MEAN:STD",
    "--random-prefix-len": "a shared prompt prefix is --dataset shared-prefix --prefix-len N",
    "--endpoint-type": "--endpoint completions|chat",
    "--streaming": "perfscope always streams (it times every token): drop --streaming",
    "--warmup-percent": "warmup is a count here: --warmup N (or --warmup-duration SECONDS)",
    "--profile": "--nvtx marks ranges for Nsight Systems; perfscope export --format perfetto "
    "gives a timeline",
    "--trust-remote-code": "nothing is downloaded or executed from a model folder: drop "
    "--trust-remote-code",
}

#: guidellm's --rate-type values → what perfscope runs instead.
RATE_TYPES: dict[str, str] = {
    "synchronous": "--concurrency 1",
    "throughput": "--mode batch (every request at once)",
    "concurrent": "--concurrency N",
    "constant": "--rate R --arrival constant",
    "poisson": "--rate R (Poisson arrivals are the default)",
    "sweep": "perfscope sweep ENGINE --rates R1,R2,... (or --points N)",
}

#: Least similarity (difflib ratio, flags compared without their ``--``) for "did you mean":
#: typos score 0.83–0.96 (``--warmpu``/``--warmup``, ``--concurency``); unrelated flags that
#: share a word score under 0.7 (``--percentile-metrics``/``--server-metrics`` 0.69).
SUGGEST_CUTOFF = 0.8


def _alias_map(command: str | None) -> dict[str, str]:
    return {a.flag: a.ours for a in ALIASES if command in a.commands}


def rewrite_aliases(argv: Sequence[str], command: str | None, known: set[str]) -> list[str]:
    """``argv`` with other tools' same-meaning flags spelled as perfscope's (``--flag`` and
    ``--flag=value``); flags the command already knows are left alone."""
    aliases = {k: v for k, v in _alias_map(command).items() if k not in known}
    out: list[str] = []
    for token in argv:
        flag, sep, value = token.partition("=")
        if flag in aliases:
            out.append(aliases[flag] + sep + value)
        else:
            out.append(token)
    return out


def pointer_for(flag: str, value: str | None = None) -> str | None:
    """The one-line pointer for another tool's flag (None if it is not one we know)."""
    if flag == "--rate-type":
        if value in RATE_TYPES:
            return f"guidellm's --rate-type {value} is {RATE_TYPES[value]} here"
        return "guidellm's --rate-type: " + "; ".join(f"{k} → {v}" for k, v in RATE_TYPES.items())
    return POINTERS.get(flag)


def suggest(flag: str, known: Sequence[str]) -> str | None:
    """The known flag ``flag`` is most likely a typo of, if it is similar enough."""
    bare = {k.lstrip("-"): k for k in known if k.startswith("--")}
    close = difflib.get_close_matches(flag.lstrip("-"), list(bare), n=1, cutoff=SUGGEST_CUTOFF)
    return bare[close[0]] if close else None
