"""The openai: engine against server behaviours of real engines, each reproduced by the scripted
server (tests/data/openai/sse_server.py): exact send stamps and connection times, an empty
first token with usage (vLLM), keep-alive-then-close (llama-server), prompt caches, wrong
model names, truncation by the server, /v1/models, /tokenize and /version."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfscope.api.runner import RunOptions, execute_run
from perfscope.errors import UsageError
from perfscope.profiler.driver import LoadConfig
from perfscope.profiler.engines.base import EngineOptions, create_engine
from perfscope.profiler.engines.openai.engine import is_saturated
from perfscope.profiler.engines.openai.tokens import count_tokens
from perfscope.profiler.records import RequestSpec
from perfscope.profiler.workload import LengthDist, WorkloadConfig
from tests.test_openai_scripted import _run_in_process, scripted_server, server_log

FAST = ("--ttft", "0.01", "--itl", "0.004")


def _specs(n: int, tag: str, out: int = 6) -> list[RequestSpec]:
    return [RequestSpec(i, 8, out, prompt=f"id={tag}{i} a few words here") for i in range(n)]


def test_sent_is_stamped_at_the_last_byte_and_connection_setup_is_its_own_column() -> None:
    with scripted_server(*FAST) as url:
        server_log(url)
        rec, clock = _run_in_process(
            url, _specs(8, "snd"), LoadConfig(mode="online", concurrency=2)
        )
        log = server_log(url)
        rec_new, _ = _run_in_process(
            url, _specs(4, "new"), LoadConfig(mode="online", concurrency=2), {"connection": "new"}
        )
    req = rec.requests_table().to_pandas().sort_values("request_id")
    assert req["error"].isna().all()
    origin = clock.origin_perf_counter_ns
    recv = np.array([log[f"snd{i}"]["recv"] for i in req["request_id"]]) - origin
    # The server read the last byte after the client wrote it, and soon after (loopback).
    wire = (recv - req["t_sent"].to_numpy()) / 1e6
    assert (wire > 0).all(), wire
    assert np.median(wire) < 5, wire
    assert (req["t_dispatched"] <= req["t_sent"]).all()
    assert (req["t_sent"] < req["t_response_headers"]).all()
    assert (req["t_response_headers"] <= req["t_first_token"]).all()
    # Two streams: two new connections, every later request reused a pooled one.
    assert req["connect_ns"].notna().sum() == 2
    assert (req["connect_ns"].dropna() > 0).all()
    assert (req["attempts"] == 1).all()
    new = rec_new.requests_table().to_pandas()
    assert new["connect_ns"].notna().all(), "connection=new opens one per request"


def test_an_empty_first_token_with_usage_is_the_first_arrival() -> None:
    with scripted_server(
        "--ttft", "0.01", "--itl", "0.03", "--usage", "per_chunk", "--empty-first"
    ) as url:
        server_log(url)
        rec, clock = _run_in_process(url, _specs(3, "emp", out=5), LoadConfig())
        log = server_log(url)
    req = rec.requests_table().to_pandas()
    chunks = rec.chunks_table().to_pandas()
    assert (req["output_tokens"] == 5).all() and req["error"].isna().all()
    for rid in range(3):
        c = chunks[chunks["request_id"] == rid].sort_values("t")
        writes = np.asarray(log[f"emp{rid}"]["writes"]) - clock.origin_perf_counter_ns
        assert len(c) == len(writes) == 5
        assert list(c["n_tokens"]) == [1] * 5
        first = req.loc[req["request_id"] == rid, "t_first_token"].iloc[0]
        # TTFT ends at the text-less first chunk, not one token gap (30 ms) later.
        assert first == c["t"].iloc[0] and 0 <= first - writes[0] < 15e6


def test_client_token_counts_are_reconciled_to_the_server_and_no_chunk_is_dropped() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Digits, Sequence, Whitespace

    tok = Tokenizer(WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    # " hel" + "lo": the word begins in chunk 1, so a tokenizer gives chunk 2 nothing.
    texts = [[(0, " hel")], [(0, "lo")], [(0, " world")]]
    tc = count_tokens(texts, [None, None, None], 3, tok)
    assert tc.per_chunk == [1, 1, 1] and tc.reconciled and tc.client_total == 2
    assert tc.mismatch_explained  # one arrival per counted token corroborates the server
    # Six words where the server counted 30 in two chunks: no round trip explains that.
    far = count_tokens(
        [[(0, " hello world hello")], [(0, " world hello world")]], [None] * 2, 30, tok
    )
    assert not far.mismatch_explained and far.per_chunk == [15, 15]

    # A tokenizer that is not the server's: each " t12" becomes t, 1, 2.
    digits = Tokenizer(WordLevel({"t": 0, **{str(d): d + 1 for d in range(10)}}, unk_token="t"))
    digits.pre_tokenizer = Sequence([Whitespace(), Digits(individual_digits=True)])

    # End to end: every chunk the server wrote is a chunk on disk, and no warning fires
    # for a difference the round trip explains.
    with scripted_server(*FAST, "--usage", "final") as url:
        engine = create_engine(f"openai:{url}", EngineOptions())
        engine.tokenizer = digits  # type: ignore[attr-defined]
        from perfscope.profiler.clock import MonotonicClock
        from perfscope.profiler.driver import Driver
        from perfscope.profiler.engines.base import Inbox
        from perfscope.profiler.recorder import Recorder

        rec = Recorder(MonotonicClock())
        inbox = Inbox()
        Driver(_specs(4, "tok", out=7), LoadConfig(), inbox, rec).start()
        engine.serve(inbox, rec)
    chunks = rec.chunks_table().to_pandas()
    assert len(chunks) == 4 * 7 and (chunks["n_tokens"] == 1).all()
    client = engine.info().config["client"]
    mm = client["token_count_mismatch"]
    assert mm["mismatched"] == 4 and mm["reconciled_to_server"] == 4
    assert mm["beyond_round_trip"] == 0
    assert not any("token counts differ" in w for w in client["warnings"])


def test_a_request_on_a_pooled_connection_the_server_closed_is_retried_once(
    runs_dir: Path,
) -> None:
    specs = _specs(12, "ka", out=4)
    with scripted_server(*FAST, "--close-after-stream", "0.3") as url:
        server_log(url)
        rec, _ = _run_in_process(url, specs, LoadConfig(mode="online", concurrency=3))
        log = server_log(url)
        rec_new, _ = _run_in_process(
            url,
            _specs(6, "kn", out=4),
            LoadConfig(mode="online", concurrency=3),
            {"connection": "new"},
        )
    req = rec.requests_table().to_pandas()
    assert req["error"].isna().all(), req["error"].dropna().tolist()
    retried = req[req["attempts"] == 2]
    assert len(retried) >= 3, req["attempts"].tolist()
    # A retried request was never processed twice: the server read each exactly once.
    assert sorted(log) == sorted(f"ka{i}" for i in range(12))
    new = rec_new.requests_table().to_pandas()
    assert new["error"].isna().all() and (new["attempts"] == 1).all()


def test_a_failure_after_the_server_read_the_request_is_never_retried() -> None:
    with scripted_server(*FAST) as url:
        server_log(url)
        spec = [RequestSpec(0, 8, 8, prompt="fault=reset id=rst0")]
        rec, _ = _run_in_process(url, spec, LoadConfig())
        assert list(server_log(url)) == ["rst0"]
    r = rec.requests_table().to_pandas().iloc[0]
    assert "reset" in r["error"] or "closed" in r["error"]
    assert r["attempts"] == 1


def test_each_run_sends_new_prompts_and_a_cached_repeat_is_reported(runs_dir: Path) -> None:
    wl = WorkloadConfig(
        requests=4,
        dataset="synthetic",
        prompt_len=LengthDist("constant", 24),
        output_len=LengthDist("constant", 4),
    )
    with scripted_server(*FAST, "--cache") as url:
        outs = [
            execute_run(RunOptions(engine=f"openai:{url}", workload=w, runs_dir=runs_dir))
            for w in (
                wl,
                wl,
                WorkloadConfig(**{**wl.__dict__, "fresh_prompts": False}),
                WorkloadConfig(**{**wl.__dict__, "fresh_prompts": False}),
            )
        ]
    salts = [
        json.loads((o.path / "manifest.json").read_text())["workload"]["prompt_salt"] for o in outs
    ]
    assert salts[0] is not None and salts[1] is not None and salts[0] != salts[1]
    assert salts[2] is None and salts[3] is None
    fresh = pd.read_parquet(outs[1].path / "requests.parquet")
    repeat = pd.read_parquet(outs[3].path / "requests.parquet")
    assert (fresh["prompt_tokens"] == 24).all()  # lengths stay seeded
    assert fresh["cached_tokens"].max() < 24 and (repeat["cached_tokens"] == 24).all()
    assert not any("prefix cache" in w for w in outs[1].summary["warnings"])
    (warn,) = [w for w in outs[3].summary["warnings"] if "prefix cache" in w]
    assert "100% of prompt tokens" in warn and "--seed" in warn
    # Compared with run 3 (the same prompts), but 4 requests a run give no 95% interval.
    assert f"in {outs[2].path.name}" in warn and "too few for a 95% interval" in warn, warn


def _seeded(requests: int, seed: int = 0) -> WorkloadConfig:
    """24-token generated prompts that repeat exactly from run to run (no prompt salt)."""
    return WorkloadConfig(
        requests=requests,
        dataset="synthetic",
        prompt_len=LengthDist("constant", 24),
        output_len=LengthDist("constant", 3),
        fresh_prompts=False,
        seed=seed,
    )


def _files(run: Path) -> dict[str, tuple[int, int]]:
    return {str(f): (f.stat().st_mtime_ns, f.stat().st_size) for f in run.rglob("*")}


@pytest.mark.parametrize(
    ("cache_ttft", "claim"),
    [("0.004", "lower beyond both"), ("0.25", "higher beyond both")],
    ids=["cache-lowers-ttft", "cache-raises-ttft"],
)
def test_a_seeded_rerun_words_its_cache_warning_from_the_previous_runs_ttft(
    runs_dir: Path, cache_ttft: str, claim: str
) -> None:
    """The same-seed warning compares TTFT with the previous run that sent the same prompts
    (read, never written) and words its claim from that: "lower" only when it was. The
    scripted server's cache answers a cached prompt after ``--cache-ttft`` instead of 100 ms."""
    wl = _seeded(12, seed=7)
    flags = ("--ttft", "0.1", "--itl", "0.004", "--cache", "--cache-ttft", cache_ttft)
    with scripted_server(*flags) as url:
        first = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
        before = _files(first.path)
        second = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
    assert _files(first.path) == before, "the previous run was written to"
    assert not any("prefix cache" in w for w in first.summary["warnings"])
    (warn,) = [w for w in second.summary["warnings"] if "prefix cache" in w]
    p50 = [1e3 * o.summary["latency"]["ttft"]["p50"] for o in (second, first)]
    assert f"TTFT p50 {p50[0]:.1f} ms against {p50[1]:.1f} ms in {first.path.name}" in warn
    assert claim in warn, warn
    if float(cache_ttft) < 0.1:
        assert "the cache likely lowered it" in warn, warn
    else:
        assert "the cache did not lower TTFT" in warn, warn
    prev = json.loads((second.path / "manifest.json").read_text())["engine"]["config"]["client"][
        "prompt_cache"
    ]["previous_run"]
    assert prev["run_id"] == first.path.name and prev["requests"] == 12


def test_a_seeded_rerun_with_no_earlier_run_in_its_folder_claims_nothing_about_ttft(
    tmp_path: Path,
) -> None:
    """The same prompts sent before from another runs folder: nothing to compare with, so
    the warning says TTFT *may* be lower, and names where it looked. Folders there that are
    not runs, or broken ones, are passed over."""
    broken = '{"status": "complete", "started_at": "2000-01-01T00:00:00", "engine": 5}'
    for junk, text in (("notes", "not json"), ("20000101-000000-x-0000", broken)):
        (tmp_path / "b" / junk).mkdir(parents=True)
        (tmp_path / "b" / junk / "manifest.json").write_text(text)
    wl = _seeded(4)
    with scripted_server(*FAST, "--cache") as url:
        for name in ("a", "b"):
            out = execute_run(
                RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=tmp_path / name)
            )
    (warn,) = [w for w in out.summary["warnings"] if "prefix cache" in w]
    assert "no earlier run with the same engine, model, workload and load is in the 2 " in warn
    assert "TTFT and prefill may be lower" in warn and "TTFT p50" not in warn, warn


def test_a_shared_prefix_workload_reports_its_hit_rate(runs_dir: Path) -> None:
    wl = WorkloadConfig(
        requests=4,
        dataset="shared-prefix",
        prefix_len=16,
        prompt_len=LengthDist("constant", 4),
        output_len=LengthDist("constant", 4),
    )
    with scripted_server(*FAST, "--cache") as url:
        out = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
    (line,) = [w for w in out.summary["warnings"] if "hit rate" in w]
    assert "3 of 4 requests" in line


def test_a_wrong_model_name_is_reported_with_the_servers_words() -> None:
    with scripted_server("--served-model", "tiny", "--unknown-model", "404") as url:
        with pytest.raises(UsageError, match=r"does not serve model 'nosuch'.*Valid aliases: tiny"):
            create_engine(f"openai:{url}", EngineOptions(extra={"model": "nosuch"}))
        eng = create_engine(f"openai:{url}", EngineOptions())
        facts = eng.info().config["server"]
        assert facts["models"] == ["tiny"] and facts["served_model"] == "tiny"
        assert facts["version"] == "scripted-1.0" and facts["tokenize"] == "prompt"
    # llama.cpp ignores the name and answers as its own alias: refused at preflight.
    with (
        scripted_server("--served-model", "tiny", "--unknown-model", "echo") as url,
        pytest.raises(UsageError, match=r"--model 'nosuch' is not served.*answered as 'tiny'"),
    ):
        create_engine(f"openai:{url}", EngineOptions(extra={"model": "nosuch"}))


def test_lengths_beyond_max_model_len_are_refused_with_the_numbers(runs_dir: Path) -> None:
    wl = WorkloadConfig(
        requests=2, prompt_len=LengthDist("constant", 60), output_len=LengthDist("constant", 16)
    )
    with (
        scripted_server("--max-model-len", "64") as url,
        pytest.raises(UsageError, match=r"needs 76 tokens .* holds 64 \(max_model_len"),
    ):
        execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))


def test_output_cut_short_by_the_server_is_flagged_and_counted(runs_dir: Path) -> None:
    prompts = runs_dir / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} " * 8}) + "\n" for i in range(3)))
    wl = WorkloadConfig(requests=3, prompts_file=prompts, output_len=LengthDist("constant", 16))
    with scripted_server(*FAST, "--slot-len", "20") as url:
        out = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
    req = pd.read_parquet(out.path / "requests.parquet")
    assert (req["output_tokens"] == 12).all() and (req["max_output_tokens"] == 16).all()
    assert (req["finish_reason"] == "length").all() and req["truncated"].all()
    assert out.summary["counts"]["truncated"] == 3 and out.summary["counts"]["completed"] == 3
    (w,) = [w for w in out.summary["warnings"] if "cut short" in w]
    assert "12 of 16" in w and "TPOT" in w


def test_inexact_prompt_lengths_are_warned_about(runs_dir: Path) -> None:
    wl = WorkloadConfig(
        requests=3,
        dataset="synthetic",
        prompt_len=LengthDist("constant", 40),
        output_len=LengthDist("constant", 4),
    )
    with scripted_server(*FAST, "--token-factor", "1.3") as url:
        out = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
        # The server's /tokenize sizes the prompts instead: exact, and no warning.
        exact_wl = WorkloadConfig(**{**wl.__dict__, "server_tokenizer": url.removesuffix("/v1")})
        exact = execute_run(
            RunOptions(engine=f"openai:{url}", workload=exact_wl, runs_dir=runs_dir)
        )
    (w,) = [w for w in out.summary["warnings"] if "prompt lengths are not exact" in w]
    assert "asked 40-40 tokens, the server counted 52-52" in w
    req = pd.read_parquet(out.path / "requests.parquet")
    assert (req["prompt_tokens"] == 52).all()
    assert (pd.read_parquet(exact.path / "requests.parquet")["prompt_tokens"] == 40).all()
    assert not any("not exact" in w for w in exact.summary["warnings"])


def test_saturation_is_judged_by_lateness_against_the_chunk_gap() -> None:
    assert not is_saturated(0.12e-3, 3e-3)  # concurrency 1 on llama.cpp: 0.12 ms late
    assert is_saturated(5.8e-3, 2.9e-3)  # concurrency 4: 5.8 ms late, gaps 2.9 ms
    assert not is_saturated(2e-3, 50e-3)  # 2 ms against 50 ms gaps is noise
    assert is_saturated(2e-3, None)


def test_a_trace_is_replayed_with_its_arrivals_lengths_and_shared_prefixes(
    runs_dir: Path,
) -> None:
    rows = [
        {"timestamp": 0, "input_length": 16, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 150, "input_length": 20, "output_length": 4, "hash_ids": [1, 2, 3]},
        {"timestamp": 300, "input_length": 16, "output_length": 3, "hash_ids": [1, 4]},
        {"timestamp": 450, "input_length": 8, "output_length": 2, "hash_ids": [5]},
    ]
    trace = runs_dir / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    wl = WorkloadConfig(requests=None, dataset="synthetic", trace_file=trace, trace_block_tokens=8)
    with scripted_server(*FAST, "--cache") as url:
        out = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
    req = pd.read_parquet(out.path / "requests.parquet").sort_values("request_id")
    assert list(req["prompt_tokens"]) == [16, 20, 16, 8]
    assert list(req["output_tokens"]) == [3, 4, 3, 2]
    gaps_s = np.diff(req["t_scheduled"].to_numpy()) / 1e9
    assert np.allclose(gaps_s, 0.15, atol=0.01), gaps_s
    # Shared hash blocks are shared prompt text: the server's cache sees exactly them.
    assert list(req["cached_tokens"]) == [0, 16, 8, 0]
    (line,) = [w for w in out.summary["warnings"] if "hit rate" in w]
    assert "2 of 4 requests" in line


def test_multi_turn_conversations_resend_the_growing_history(runs_dir: Path) -> None:
    wl = WorkloadConfig(
        requests=6,
        dataset="multi-turn",
        turns=3,
        prompt_len=LengthDist("constant", 6),
        output_len=LengthDist("constant", 4),
    )
    with scripted_server(*FAST, "--cache") as url:
        out = execute_run(RunOptions(engine=f"openai:{url}", workload=wl, runs_dir=runs_dir))
    req = pd.read_parquet(out.path / "requests.parquet").sort_values("request_id")
    assert req["error"].isna().all()
    # Ids go turn by turn over the 2 conversations: 0,1 first turns; 2,3 second; 4,5 third.
    p = req["prompt_tokens"].to_numpy()
    assert (p[2:4] > p[0:2]).all() and (p[4:6] > p[2:4]).all()
    # Each later turn finds the previous turn's prompt in the cache, and waited for its reply.
    cached = req["cached_tokens"].to_numpy()
    assert (cached[2:] >= p[:4]).all(), (cached, p)
    sent = req["t_sent"].to_numpy()
    last = req["t_last_token"].to_numpy()
    assert (sent[2:] >= last[:4]).all()
    assert any("hit rate" in w for w in out.summary["warnings"])


def test_streams_sharded_over_worker_processes_keep_the_run_clock() -> None:
    specs = _specs(12, "wk", out=6)
    with scripted_server(*FAST, "--close-after-stream", "0.3") as url:
        server_log(url)
        engine = create_engine(f"openai:{url}", EngineOptions(extra={"workers": "2"}))
        try:
            from perfscope.profiler.clock import MonotonicClock
            from perfscope.profiler.driver import Driver
            from perfscope.profiler.engines.base import Inbox
            from perfscope.profiler.recorder import Recorder

            clock = MonotonicClock()
            rec = Recorder(clock)
            inbox = Inbox()
            driver = Driver(specs, LoadConfig(mode="online", concurrency=4), inbox, rec)
            driver.start()
            engine.serve(inbox, rec)
            driver.join()
        finally:
            engine.close()
        log = server_log(url)
    req = rec.requests_table().to_pandas().sort_values("request_id")
    chunks = rec.chunks_table().to_pandas()
    assert req["error"].isna().all(), req["error"].dropna().tolist()
    assert (req["attempts"] == 2).sum() >= 1  # workers retry a dead pooled connection too
    origin = clock.origin_perf_counter_ns
    for rid in req["request_id"]:
        w = np.asarray(log[f"wk{rid}"]["writes"]) - origin
        t = np.sort(chunks[chunks["request_id"] == rid]["t"].to_numpy())
        assert len(t) == len(w) == 6
        # Stamped in another process, on the same clock: never before the write, and soon
        # (loosely: one descheduled process on a shared 2-core machine delays a stamp).
        assert (t >= w).all() and np.median(t - w) < 50e6, (t - w) / 1e6
    client = engine.info().config["client"]
    assert client["workers"] == 2
    if client["stamp_clock"] == "kernel":  # the workers' reads came back with their stamps
        assert client["stall"]["evidence"]["reads"] >= 12 * 6 / 2
    else:
        assert client["stamp_delay_s"]["samples"] > 0


def test_multi_turn_from_a_file_resends_the_recorded_replies(tmp_path: Path) -> None:
    from perfscope.profiler.workload import build_workload

    convs = [
        {
            "conversations": [
                {"from": "human", "value": "first question here"},
                {"from": "gpt", "value": "first answer with five words"},
                {"from": "human", "value": "second question"},
                {"from": "gpt", "value": "second answer"},
            ]
        }
    ]
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(convs))
    specs = build_workload(
        WorkloadConfig(requests=2, dataset="multi-turn", dataset_path=path, turns=2)
    )
    assert [s.after for s in specs] == [None, 0]
    assert specs[0].prompt == "User: first question here"
    assert specs[1].prompt == (
        "User: first question here\nAssistant: first answer with five words\nUser: second question"
    )
    # The recorded reply sets the output length (one word a token without a tokenizer).
    assert [s.max_output_tokens for s in specs] == [5, 2]


def test_a_shared_bos_token_served_from_cache_is_not_a_prefix_cache_hit() -> None:
    from perfscope.analysis.prompt_cache import prompt_cache_section

    # The scripted cache counts the words a prompt shares with an earlier one: the first word
    # ("bos") stands for the BOS every llama.cpp prompt starts with.
    prompts = ["bos alpha beta gamma", "bos delta eps zeta", "bos alpha beta gamma eta"]
    specs = [RequestSpec(i, 4, 3, prompt=p) for i, p in enumerate(prompts)]
    with scripted_server(*FAST, "--cache") as url:
        rec, _ = _run_in_process(url, specs, LoadConfig(mode="online", concurrency=1))
    req = rec.requests_table().to_pandas().sort_values("request_id")
    assert req["cached_tokens"].tolist() == [0, 1, 4]
    pc = prompt_cache_section(req)
    assert pc is not None and pc.requests_hit == 1 and pc.requests_reporting == 3
