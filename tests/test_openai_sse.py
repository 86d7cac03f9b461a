"""SSE parsing, token counting and request bodies of the openai: engine."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from perfscope.profiler.engines.openai.client import StreamResult, _apply_event, build_body
from perfscope.profiler.engines.openai.sse import SSEParser
from perfscope.profiler.engines.openai.tokens import count_tokens, spread

STREAM = (
    b": keep-alive\n\n"
    b'data: {"choices":[{"index":0,"text":"Hel"}]}\r\n\r\n'
    b"event: message\nid: 3\nretry: 10\ngarbage line\n\n"
    b'data: {"choices":[{"index":0,"text":"lo"}]}\n\n'
    b"data: first\ndata: second\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    '{"choices":[{"index":0,"text":"Hel"}]}',
    '{"choices":[{"index":0,"text":"lo"}]}',
    "first\nsecond",
    "[DONE]",
]


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_events_survive_any_split_of_the_stream(cut: int) -> None:
    p = SSEParser()
    events = p.feed(STREAM[:cut]) + p.feed(STREAM[cut:]) + p.close()
    assert events == EXPECTED
    assert p.comments == 1 and p.ignored_lines == 1


def test_byte_by_byte_feeding_and_lone_cr_line_endings() -> None:
    p = SSEParser()
    events = [e for b in STREAM.replace(b"\n", b"\r") for e in p.feed(bytes([b]))] + p.close()
    assert events == EXPECTED


def test_json_data_lines_without_blank_separators_are_separate_events() -> None:
    p = SSEParser()
    out = p.feed(b'data: {"a":1}\ndata: {"b":2}\n')
    assert out == ['{"a":1}', '{"b":2}']  # delivered when each line arrived
    assert p.close() == []


def test_role_only_empty_usage_only_and_multi_choice_chunks() -> None:
    res = StreamResult()
    for payload in (
        '{"choices":[{"index":0,"delta":{"role":"assistant"}}]}',
        '{"choices":[{"index":0,"delta":{"content":""}}]}',
        '{"choices":[{"index":0,"delta":{"content":"a"}}]}',
        '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}',
        "[DONE]",
    ):
        _apply_event(res, payload, 7)
    res.settle()  # the stream ended: decide the arrivals
    assert res.texts == [[(0, "a")]]
    assert res.completion_tokens == 2 and res.prompt_tokens == 5
    assert res.done and res.finish_reasons == ["length"]
    with pytest.raises(ValueError, match=r"choice index 1: .*\(n > 1\) is not measured"):
        _apply_event(res, '{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}', 8)
    with pytest.raises(ValueError, match="malformed stream"):
        _apply_event(res, "{nope", 8)
    with pytest.raises(ValueError, match="server error in stream: boom"):
        _apply_event(res, '{"error":{"message":"boom"}}', 8)


def test_spread_keeps_the_total_and_gives_each_text_chunk_a_token() -> None:
    assert spread([1, 1, 1], 3, floor_one=True) == [1, 1, 1]
    assert sum(spread([3, 1, 1], 9, floor_one=True)) == 9
    assert spread([3, 1, 1], 9, floor_one=True)[0] > 2
    assert spread([], 4) == []


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["hello world hello there world"] * 50,
        trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>"]),
    )
    return tok


def test_token_sources_in_order_of_preference() -> None:
    texts = [[(0, " hello")], [(0, " world hello")], [(0, " there")]]
    tok = _tokenizer()
    per_chunk = count_tokens(texts, [1, 3, 4], 4, tok)
    assert per_chunk.source == "server_per_chunk" and per_chunk.per_chunk == [1, 2, 1]
    by_tok = count_tokens(texts, [None] * 3, None, tok)
    assert by_tok.source == "tokenizer" and by_tok.per_chunk == [1, 2, 1]
    assert by_tok.client_total == 4 and by_tok.mismatch is None
    # The server's total wins; the difference is reported.
    vs_server = count_tokens(texts, [None] * 3, 5, tok)
    assert vs_server.total == 5 and sum(vs_server.per_chunk) == 5 and vs_server.mismatch == -1
    assert count_tokens(texts, [None] * 3, 6, None).source == "server_total"
    assert count_tokens(texts, [None] * 3, None, None).per_chunk == [1, 1, 1]


def test_tokenizer_count_has_no_special_tokens_per_chunk() -> None:
    # Re-tokenising each chunk (with a BOS each) would give 2 per chunk; we give 1.
    texts = [[(0, " hello")] for _ in range(10)]
    assert count_tokens(texts, [None] * 10, None, _tokenizer()).total == 10


def test_request_bodies() -> None:
    b = build_body(
        "chat",
        "m",
        "hi",
        5,
        ignore_eos=True,
        include_usage=True,
        continuous_usage=True,
        extra={"temperature": 0},
    )
    assert b["messages"] == [{"role": "user", "content": "hi"}] and b["stream"] is True
    assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert b["ignore_eos"] is True and b["temperature"] == 0 and b["max_tokens"] == 5
    c = build_body(
        "completions",
        "m",
        [1, 2],
        None,
        ignore_eos=False,
        include_usage=False,
        continuous_usage=False,
    )
    assert c == {"model": "m", "stream": True, "prompt": [1, 2]}
    json.dumps(c)


def test_usage_on_the_final_chunk_only_is_not_per_chunk_usage() -> None:
    # transformers serve: text chunks without usage, then a finish chunk carrying the usage.
    res = StreamResult()
    for payload in (
        '{"choices":[{"index":0,"text":"ab"}]}',
        '{"choices":[{"index":0,"text":"c"}]}',
        '{"choices":[{"index":0,"text":"","finish_reason":"length"}],'
        '"usage":{"prompt_tokens":3,"completion_tokens":5}}',
    ):
        _apply_event(res, payload, 1)
    res.settle()
    assert len(res.t_ns) == 2 and not res.usage_per_chunk
    tc = count_tokens(res.texts, res.cumulative, res.completion_tokens, None)
    assert tc.source == "server_total" and tc.per_chunk == [3, 2] and tc.total == 5


def test_a_usage_increment_without_text_is_an_arrival_only_with_per_chunk_usage() -> None:
    # vLLM: the first token is half a UTF-8 sequence, so its chunk has no text, only usage.
    vllm = StreamResult()
    for payload in (
        '{"choices":[{"index":0,"text":""}],"usage":{"completion_tokens":1}}',
        '{"choices":[{"index":0,"text":"\\u00e9a"}],"usage":{"completion_tokens":2}}',
        '{"choices":[{"index":0,"text":"","finish_reason":"length"}],'
        '"usage":{"completion_tokens":2}}',
    ):
        _apply_event(vllm, payload, len(vllm.candidates))
    vllm.settle()
    assert vllm.usage_per_chunk and vllm.t_ns == [0, 1] and vllm.cumulative == [1, 2]
    # llama.cpp: usage only on the text-less finishing chunk: a final usage, not an arrival.
    llama = StreamResult()
    for payload in (
        '{"choices":[{"index":0,"text":"a"}]}',
        '{"choices":[{"index":0,"text":"b"}]}',
        '{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":'
        '{"completion_tokens":2,"prompt_tokens":65,"prompt_tokens_details":{"cached_tokens":1}},'
        '"timings":{"cache_n":1}}',
    ):
        _apply_event(llama, payload, len(llama.candidates))
    llama.settle()
    assert not llama.usage_per_chunk and llama.t_ns == [0, 1]
    assert llama.cached_tokens == 1 and llama.completion_tokens == 2
