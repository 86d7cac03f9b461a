"""``openai:URL`` engine: OpenAI-compatible streaming HTTP servers (vLLM, SGLang, TGI,
llama.cpp server, ``transformers serve``, Ollama).

Needs the ``openai`` extra (aiohttp, tokenizers): ``pip install 'perfscope[openai]'``.
"""

from __future__ import annotations

from perfscope.profiler.engines.base import EngineOptions, register_engine
from perfscope.profiler.engines.openai.config import API_KEY_ENV, OpenAIConfig, redact_url
from perfscope.profiler.engines.openai.engine import OpenAIEngine, create_openai_engine
from perfscope.profiler.engines.openai.sse import SSEParser
from perfscope.profiler.engines.openai.tokens import count_tokens, load_tokenizer

__all__ = [
    "API_KEY_ENV",
    "OpenAIConfig",
    "OpenAIEngine",
    "SSEParser",
    "count_tokens",
    "create_openai_engine",
    "load_tokenizer",
    "redact_url",
]


@register_engine("openai")
def _create(uri: str, options: EngineOptions) -> OpenAIEngine:
    return create_openai_engine(uri, options)
