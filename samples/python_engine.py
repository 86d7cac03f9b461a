"""A ``python:`` engine: any function that yields tokens can be profiled.

Run it from this folder (so the module is importable):

    cd samples
    perfscope run python:python_engine:generate --requests 16 --mode online --concurrency 4

perfscope calls ``generate`` once per request with the arguments its signature names
(``prompt``, ``prompt_tokens``, ``max_tokens``, ``request_id``, ``request``) and stamps every
chunk it yields. Here a chunk is a list of token strings; an ``int`` (a token count) or a
single string (one token) work too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

#: Simulated cost model of a server: prefill time per prompt token and time per output
#: token, with chunks of up to 4 tokens (as servers that stream detokenised text do).
PREFILL_S_PER_TOKEN = 0.0002
DECODE_S_PER_TOKEN = 0.004
CHUNK = 4


def generate(prompt_tokens: int, max_tokens: int) -> Iterator[list[str]]:
    """Stream ``max_tokens`` tokens: the first after the prefill, then in chunks."""
    time.sleep(prompt_tokens * PREFILL_S_PER_TOKEN)
    yield ["<first>"]
    produced = 1
    while produced < max_tokens:
        n = min(CHUNK, max_tokens - produced)
        time.sleep(n * DECODE_S_PER_TOKEN)
        yield [f"tok{produced + i}" for i in range(n)]
        produced += n
