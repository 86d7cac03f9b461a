"""Prompt (prefix) cache statistics of a run from its requests table.

Engines that know how many prompt tokens came from a prefix cache record them per request
(``cached_tokens``: the reference engine with ``prefix_cache=on``, HTTP servers that report
``usage.prompt_tokens_details.cached_tokens``); requests that report none are left out.
"""

from __future__ import annotations

import pandas as pd

from perfscope.analysis.summary import PromptCache

__all__ = ["SHARED_BOS_TOKENS", "prompt_cache_section"]

#: Cached prompt tokens every request has (the shared BOS): not a prefix-cache hit.
SHARED_BOS_TOKENS = 1


def prompt_cache_section(requests: pd.DataFrame | None) -> PromptCache | None:
    """The ``prompt_cache`` summary section (:class:`~perfscope.analysis.summary.PromptCache`),
    or None when no measured request reports.

    Over the measured (not warmup), successful requests that report ``cached_tokens``:
    ``requests_reporting``, ``requests_hit`` (more tokens cached than the shared BOS),
    ``hit_rate`` (their share),
    ``cached_tokens`` and ``prompt_tokens`` (sums), ``share`` (cached / prompt tokens, the
    share of prefill work the cache saved), ``cached_tokens_mean`` and
    ``prompt_tokens_mean`` (per request).
    """
    if requests is None or requests.empty or "cached_tokens" not in requests:
        return None
    df = requests
    if "is_warmup" in df:
        df = df[~df["is_warmup"].fillna(False).astype(bool)]
    if "error" in df:
        df = df[df["error"].isna()]
    df = df[df["cached_tokens"].notna()]
    if df.empty:
        return None
    cached = df["cached_tokens"].astype("float64")
    prompt = df["prompt_tokens"].astype("float64")
    n = len(df)
    # A hit caches more than the BOS token every prompt shares (llama.cpp reports it cached).
    hits = int((cached > SHARED_BOS_TOKENS).sum())
    total_prompt = float(prompt.sum())
    return PromptCache(
        requests_reporting=n,
        requests_hit=hits,
        hit_rate=hits / n,
        cached_tokens=int(cached.sum()),
        prompt_tokens=int(total_prompt),
        share=float(cached.sum()) / total_prompt if total_prompt > 0 else None,
        cached_tokens_mean=float(cached.mean()),
        prompt_tokens_mean=float(prompt.mean()),
    )
