"""Server-side metrics: the Prometheus text parser on texts recorded from vLLM and llama.cpp,
the sampler against a real loopback HTTP endpoint, the per-run section, and the
``--server-metrics`` flag end to end."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pyarrow.parquet as pq
import pytest

from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.server_metrics import histogram_delta, server_metrics_section
from perfscope.analysis.summary import ServerMetrics
from perfscope.cli import main
from perfscope.profiler.clock import MonotonicClock
from perfscope.profiler.server_metrics import (
    ServerMetricsConfig,
    ServerMetricsSampler,
    detect_server,
    format_labels,
    metrics_url_for,
    parse_prometheus_text,
    resolve_metrics_url,
)
from tests.conftest import DATA

#: The recorded /metrics texts of ../shared/fixtures (beside the checkout, as CI lays it).
SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "metrics"
LOCAL = DATA / "server_metrics"


def _fixture(name: str) -> str:
    """A recorded /metrics text: the copy in tests/data (the shared folder is the source)."""
    return (LOCAL / name).read_text(encoding="utf-8")


def _frame(before: str, after: str) -> pd.DataFrame:
    rows = []
    for t, snap, text in ((0, "start", before), (2_000_000_000, "end", after)):
        for s in parse_prometheus_text(text):
            rows.append((t, snap, s.name, format_labels(s.labels), s.value))
    return pd.DataFrame(rows, columns=["t", "snapshot", "name", "labels", "value"])


def _grep_value(text: str, name: str) -> float:
    """The value of an unlabelled-or-single-series line, read with a regex (an independent
    reading of the file, not the parser under test)."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


# --------------------------------------------------------------------------- parser


def test_recorded_fixtures_are_copied_verbatim() -> None:
    if not SHARED.is_dir():
        pytest.skip("the shared fixtures folder is not on this machine")
    for src in SHARED.glob("*.prom"):
        assert (LOCAL / src.name).read_bytes() == src.read_bytes(), src.name


def test_parser_reads_labels_escapes_special_values_and_timestamps() -> None:
    text = (
        "# HELP x something\n# TYPE x counter\n"
        'x_total{a="1",b="say \\"hi\\", {ok}\\\\",c="line\\nbreak"} 3.5 1700000000000\n'
        "plain 7\n"
        'inf_metric{le="+Inf"} +Inf\n'
        "nan_metric NaN\n"
        "neg -1.5e-3\n"
        "# EOF\n"
        "after_eof 1\n"
    )
    samples = parse_prometheus_text(text)
    assert [s.name for s in samples] == ["x_total", "plain", "inf_metric", "nan_metric", "neg"]
    x = samples[0]
    assert x.labels == (("a", "1"), ("b", 'say "hi", {ok}\\'), ("c", "line\nbreak"))
    assert x.value == 3.5
    assert samples[1].labels == () and samples[1].value == 7.0
    assert samples[2].label("le") == "+Inf" and samples[2].value == math.inf
    assert math.isnan(samples[3].value)
    assert samples[4].value == -1.5e-3
    # The canonical label text parses back to the same labels.
    again = parse_prometheus_text(f"x{{{format_labels(x.labels)}}} 1\n")[0]
    assert again.labels == x.labels


def test_parser_rejects_a_line_without_a_value() -> None:
    with pytest.raises(ValueError, match="without a value"):
        parse_prometheus_text('x{a="1"}\n')


@pytest.mark.parametrize(
    ("name", "kind"),
    [("vllm-0.32-cpu-after.prom", "vllm"), ("llamacpp-0c1e570-after.prom", "llamacpp")],
)
def test_server_kind_is_detected_from_the_recorded_text(name: str, kind: str) -> None:
    names = [s.name for s in parse_prometheus_text(_fixture(name))]
    assert detect_server(names) == kind


def test_sglang_and_tgi_names_are_detected() -> None:
    assert detect_server(["sglang:num_running_reqs", "process_cpu_seconds_total"]) == "sglang"
    assert detect_server(["tgi_queue_size", "tgi_request_duration_sum"]) == "tgi"
    assert detect_server(["python_gc_objects_collected_total"]) is None


# --------------------------------------------------------------------------- vLLM section


def test_vllm_means_are_the_histogram_deltas_of_the_recorded_run() -> None:
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    sec = server_metrics_section(_frame(before, after), {"server": "vllm"})
    assert sec.available and sec.server == "vllm"
    lat = sec.latency
    for key, metric in (
        ("ttft", "vllm:time_to_first_token_seconds"),
        ("itl", "vllm:inter_token_latency_seconds"),
        ("queue", "vllm:request_queue_time_seconds"),
        ("prefill", "vllm:request_prefill_time_seconds"),
        ("decode", "vllm:request_decode_time_seconds"),
        ("e2e", "vllm:e2e_request_latency_seconds"),
    ):
        ds = _grep_value(after, f"{metric}_sum") - _grep_value(before, f"{metric}_sum")
        dc = _grep_value(after, f"{metric}_count") - _grep_value(before, f"{metric}_count")
        assert lat[key].mean_s == pytest.approx(ds / dc, rel=1e-12), key
    # The fixture holds exactly 64 requests of 32 output tokens (31 gaps each).
    assert lat["ttft"].count == 64 and sec.requests == 64
    assert lat["itl"].count == 64 * 31
    assert sec.tokens == {"prompt": 64 * 64, "generation": 64 * 32, "prompt_cached": 0}
    assert sec.prefix_cache_hit_rate == 0.0
    assert sec.preemptions == 0


def test_ttft_is_split_into_client_network_queue_and_prefill() -> None:
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    sec = server_metrics_section(_frame(before, after), {}, client_ttft_mean_s=0.0850)
    split = sec.ttft_split
    server = sec.latency["ttft"].mean_s
    assert split.server_ttft_mean_s == server
    assert split.client_network_s == pytest.approx(0.0850 - server)
    assert split.queue_s == sec.latency["queue"].mean_s
    assert split.prefill_s == sec.latency["prefill"].mean_s
    parts = split.queue_s + split.prefill_s + split.server_other_s
    assert parts == pytest.approx(server)


def test_a_user_space_stall_is_never_booked_as_network_time() -> None:
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    frame = _frame(before, after)
    user = {"clock": "user", "in_stamps": True, "stalled": True, "worst_s": 1.3}
    sec = server_metrics_section(frame, {}, client_ttft_mean_s=0.299, client_stall=user)
    split = sec.ttft_split
    server = sec.latency["ttft"].mean_s
    assert split.client_network_s is None
    assert split.client_network_or_stall_s == pytest.approx(0.299 - server)
    assert split.client_stall_max_s == 1.3
    assert any("not network time" in n for n in sec.notes)
    # Kernel stamps carry no stall: the remainder is the client/network/front-end share.
    kernel = {"clock": "kernel", "in_stamps": False, "stalled": True, "worst_s": 1.3}
    sec = server_metrics_section(frame, {}, client_ttft_mean_s=0.0850, client_stall=kernel)
    assert sec.ttft_split.client_network_s == pytest.approx(0.0850 - server)
    assert sec.ttft_split.stamp_clock == "kernel"


def test_a_client_tpot_below_the_servers_is_called_bunched_reads() -> None:
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    frame = _frame(before, after)
    server_tpot = server_metrics_section(frame, {}).latency["tpot"].mean_s
    sec = server_metrics_section(frame, {}, client_tpot_mean_s=0.5 * server_tpot)
    assert any("bunched" in n for n in sec.notes)
    sec = server_metrics_section(frame, {}, client_tpot_mean_s=server_tpot)
    assert not any("bunched" in n for n in sec.notes)


def test_histogram_delta_refuses_a_counter_reset() -> None:
    before, after = _fixture("vllm-0.32-cpu-after.prom"), _fixture("vllm-0.32-cpu-before.prom")
    f = _frame(before, after)
    start, end = f[f["snapshot"] == "start"], f[f["snapshot"] == "end"]
    assert histogram_delta(start, end, "vllm:time_to_first_token_seconds") is None


def _tiny_llama() -> ModelSpec:
    return ModelSpec.from_dict(
        {
            "name": "tiny-llama",
            "n_layers": 4,
            "hidden_size": 256,
            "n_heads": 4,
            "n_kv_heads": 4,
            "head_dim": 64,
            "intermediate_size": 688,
            "vocab_size": 8192,
        }
    )


def _requests_64x32() -> pd.DataFrame:
    """The fixtures' run: 64 completed requests of 64 prompt and 32 output tokens."""
    return pd.DataFrame(
        {
            "prompt_tokens": [64] * 64,
            "output_tokens": [32] * 64,
            "error": [None] * 64,
            "is_warmup": [False] * 64,
        }
    )


def test_vllm_work_counters_are_reported_beside_the_cost_model() -> None:
    """The recorded server had its FLOP counters off (they stay 0): the section says so and
    still gives perfscope's cost model for the same requests."""
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    spec, requests = _tiny_llama(), _requests_64x32()
    sec = server_metrics_section(_frame(before, after), {}, model=spec, requests=requests)
    work = sec.work
    assert work.server_flops == 0
    assert any("did not move" in n for n in sec.notes)
    cm = work.cost_model
    assert cm.requests == 64
    # 2 FLOP per non-lm_head matmul parameter per token is a lower bound.
    from perfscope.analysis.costmodel import matmul_params

    assert cm.flops > 2 * matmul_params(spec, lm_head=False) * 64 * (64 + 31)
    assert work.engine_steps == 143 and cm.bytes > 0
    assert work.flops_ratio_server_to_model is None


# --------------------------------------------------------------------------- llama.cpp


def test_llamacpp_prompt_seconds_are_busy_time_not_per_request_prefill() -> None:
    before = _fixture("llamacpp-0c1e570-before.prom")
    after = _fixture("llamacpp-0c1e570-after.prom")
    sec = server_metrics_section(_frame(before, after), {}, client_ttft_mean_s=0.02)
    assert sec.server == "llamacpp"
    lc = sec.llamacpp
    d = {
        n: _grep_value(after, f"llamacpp:{n}") - _grep_value(before, f"llamacpp:{n}")
        for n in (
            "prompt_seconds_total",
            "tokens_predicted_seconds_total",
            "tokens_predicted_total",
        )
    }
    assert lc.prompt_busy_s == pytest.approx(d["prompt_seconds_total"])
    # The server's mean time per output token is generation seconds / generated tokens.
    assert sec.latency["tpot"].mean_s == pytest.approx(
        d["tokens_predicted_seconds_total"] / d["tokens_predicted_total"]
    )
    # No TTFT, queue or prefill is derived from the busy time.
    assert not {"ttft", "queue", "prefill"} & set(sec.latency)
    assert sec.ttft_split is None
    assert any("busy time" in n for n in sec.notes)


# --------------------------------------------------------------------------- the stored form

#: The section's JSON for the recorded fixtures, as the section wrote it when it still built
#: a dict (commit 6686e7c): a summary.json is the same file before and after it became a record.
STORED = DATA / "server_metrics" / "section"


def _stored_cases() -> dict[str, ServerMetrics]:
    def frame(prefix: str) -> pd.DataFrame:
        return _frame(_fixture(f"{prefix}-before.prom"), _fixture(f"{prefix}-after.prom"))

    vllm, lcpp = frame("vllm-0.32-cpu"), frame("llamacpp-0c1e570")
    user = {"clock": "user", "in_stamps": True, "stalled": True, "worst_s": 1.3}
    kernel = {"clock": "kernel", "in_stamps": False, "stalled": True, "worst_s": 1.3}
    model = {"model": _tiny_llama(), "requests": _requests_64x32()}
    info = {"server": "vllm", "url": "http://x/metrics", "interval_s": 0.5}
    return {
        "vllm": server_metrics_section(vllm, info),
        "vllm_split": server_metrics_section(
            vllm, {}, client_ttft_mean_s=0.085, client_tpot_mean_s=0.001
        ),
        "vllm_user_stall": server_metrics_section(
            vllm, {}, client_ttft_mean_s=0.299, client_stall=user
        ),
        "vllm_kernel_stall": server_metrics_section(
            vllm, {}, client_ttft_mean_s=0.085, client_stall=kernel
        ),
        "vllm_work": server_metrics_section(vllm, {}, **model),
        "llamacpp": server_metrics_section(lcpp, {}, client_ttft_mean_s=0.02),
        "empty": server_metrics_section(pd.DataFrame(), {"reason": "no endpoint", "url": "u"}),
        "unknown": server_metrics_section(vllm.assign(name="foo_" + vllm["name"]), {}),
        **{
            p: server_metrics_section(frame(p), {}, client_ttft_mean_s=0.05, **model)
            for p in ("vllm-live", "llamacpp-live")
        },
    }


def test_the_server_metrics_record_writes_the_json_the_dict_section_wrote() -> None:
    cases = _stored_cases()
    assert sorted(cases) == sorted(p.stem for p in STORED.glob("*.json"))
    for name, sec in cases.items():
        text = json.dumps(sec.to_dict(), indent=1)
        assert text == (STORED / f"{name}.json").read_text(), name
        assert not sec.extra, name  # every key the section writes is a field
        assert ServerMetrics.from_dict(json.loads(text)) == sec, name


# --------------------------------------------------------------------------- sampler


class _MetricsHandler(BaseHTTPRequestHandler):
    texts: ClassVar[list[str]] = []
    hits = 0

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        cls = type(self)
        text = cls.texts[min(cls.hits, len(cls.texts) - 1)]
        cls.hits += 1
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def metrics_endpoint(*texts: str) -> Iterator[str]:
    """A loopback HTTP server whose /metrics answers texts[0], texts[1], ... then the last."""
    handler = type("H", (_MetricsHandler,), {"texts": list(texts), "hits": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


def test_sampler_takes_start_periodic_and_end_snapshots_on_the_run_clock() -> None:
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    clock = MonotonicClock()
    with metrics_endpoint(before, after) as url:
        sampler = ServerMetricsSampler(url, clock.now_ns, interval_s=0.05)
        assert sampler.start()
        t_mid = clock.now_ns()
        while clock.now_ns() - t_mid < 300_000_000:
            clock.sleep_until_ns(clock.now_ns() + 20_000_000)
        table = sampler.stop()
    frame = table.to_pandas()
    kinds = frame.groupby("snapshot")["t"].nunique().to_dict()
    assert kinds["start"] == 1 and kinds["end"] == 1 and kinds["sample"] >= 2
    t_start = frame.loc[frame["snapshot"] == "start", "t"].iloc[0]
    t_end = frame.loc[frame["snapshot"] == "end", "t"].iloc[0]
    assert 0 <= t_start < t_mid < t_end
    # Periodic scrapes keep the engine's families without buckets; snapshots keep buckets.
    periodic = frame[frame["snapshot"] == "sample"]
    assert periodic["name"].str.startswith("vllm:").all()
    assert not periodic["name"].str.endswith("_bucket").any()
    assert frame.loc[frame["snapshot"] == "end", "name"].str.endswith("_bucket").any()
    info = sampler.manifest_info()
    assert info["server"] == "vllm" and info["failed_scrapes"] == 0
    sec = server_metrics_section(frame, info)
    assert sec["latency"]["ttft"]["count"] == 64
    assert sec["series"]["running"][0][0] == pytest.approx(t_start * 1e-9)


def test_gauges_are_sampled_ten_times_a_run_and_at_most_every_100ms() -> None:
    sampler = ServerMetricsSampler("http://127.0.0.1:1/metrics", MonotonicClock().now_ns)
    # The default 1 s interval: 100 ms early on, elapsed/20 later, never beyond 1 s.
    steps = [sampler.next_interval_s(t) for t in (0.0, 1.0, 2.0, 10.0, 60.0)]
    assert steps == pytest.approx([0.1, 0.1, 0.1, 0.5, 1.0])
    # Any run of a second or more gets at least 10 samples; none come faster than 100 ms.
    for run_s in (1.05, 3.0, 30.0, 300.0):
        t, n = 0.0, 0
        while t + sampler.next_interval_s(t) <= run_s:
            assert sampler.next_interval_s(t) >= 0.1
            t += sampler.next_interval_s(t)
            n += 1
        assert n >= 10, (run_s, n)
    # An explicit faster interval is kept.
    fast = ServerMetricsSampler("http://127.0.0.1:1/metrics", MonotonicClock().now_ns, 0.05)
    assert fast.next_interval_s(0.0) == 0.05


def test_an_endpoint_that_is_not_there_leaves_the_run_without_server_metrics() -> None:
    from perfscope.profiler.server_metrics import start_server_metrics

    with metrics_endpoint("x 1\n") as url:
        dead = url.replace("/metrics", "/nothing")
        sampler, info = start_server_metrics(
            ServerMetricsConfig(mode="url", url=dead), "openai:http://x/v1", lambda: 0
        )
    assert sampler is None and not info["enabled"]
    assert "404" in info["reason"]


def test_server_metrics_flag_values() -> None:
    assert ServerMetricsConfig.parse("off").mode == "off"
    assert ServerMetricsConfig.parse(None).mode == "auto"
    cfg = ServerMetricsConfig.parse("127.0.0.1:9000")
    assert (cfg.mode, cfg.url) == ("url", "http://127.0.0.1:9000/metrics")
    assert ServerMetricsConfig.parse("http://h:1/custom").url == "http://h:1/custom"
    with pytest.raises(ValueError, match="auto, off or an http"):
        ServerMetricsConfig.parse("ftp://h/metrics")
    assert metrics_url_for("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    auto = ServerMetricsConfig()
    assert resolve_metrics_url(auto, "openai:http://h:5/v1") == "http://h:5/metrics"
    assert resolve_metrics_url(auto, "reference") is None
    assert resolve_metrics_url(ServerMetricsConfig(mode="off"), "openai:http://h:5/v1") is None


def test_bad_server_metrics_flag_is_a_one_line_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["run", "--server-metrics", "ftp://x", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --server-metrics") and err.count("\n") == 1


def test_run_with_server_metrics_url_stores_the_table_and_the_summary_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """perfscope run against a scripted SSE server, scraping a Prometheus endpoint that
    answers the recorded vLLM texts: the run dir holds server_metrics.parquet and the summary
    the server's means, beside the client's."""
    before, after = _fixture("vllm-0.32-cpu-before.prom"), _fixture("vllm-0.32-cpu-after.prom")
    proc = subprocess.Popen(
        [sys.executable, str(DATA / "openai" / "sse_server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), line
        base = f"http://127.0.0.1:{int(line.split()[1])}/v1"
        with metrics_endpoint(before, after) as murl:
            code = main(
                [
                    "run",
                    f"openai:{base}",
                    "--requests",
                    "6",
                    "--prompt-len",
                    "8",
                    "--output-len",
                    "4",
                    "--concurrency",
                    "2",
                    "--server-metrics",
                    murl,
                    "--server-metrics-interval",
                    "50ms",
                    "--no-progress",
                    "--no-report",
                    "--json",
                    "--runs-dir",
                    str(tmp_path),
                ]
            )
    finally:
        proc.terminate()
        proc.wait(10)
    out = capsys.readouterr().out
    assert code == 0
    summary = json.loads(out)
    sec = summary["server_metrics"]
    assert sec["available"] and sec["server"] == "vllm"
    assert sec["latency"]["ttft"]["count"] == 64
    assert sec["ttft_split"]["client_ttft_mean_s"] == summary["latency"]["ttft"]["mean"]
    (run_dir,) = list(tmp_path.iterdir())
    table = pq.read_table(run_dir / "server_metrics.parquet").to_pandas()
    assert set(table["snapshot"]) >= {"start", "end"}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["server_metrics"]["url"] == murl
    assert manifest["server_metrics"]["scrapes"] >= 2


def test_auto_mode_on_a_server_without_metrics_records_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(DATA / "openai" / "sse_server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])
        code = main(
            [
                "run",
                f"openai:http://127.0.0.1:{port}/v1",
                "--requests",
                "2",
                "--prompt-len",
                "4",
                "--output-len",
                "2",
                "--no-progress",
                "--no-report",
                "--json",
                "--runs-dir",
                str(tmp_path),
            ]
        )
    finally:
        proc.terminate()
        proc.wait(10)
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["server_metrics"]["available"] is False
    (run_dir,) = list(tmp_path.iterdir())
    assert not (run_dir / "server_metrics.parquet").exists()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["server_metrics"]["enabled"] is False
    assert manifest["server_metrics"]["reason"]


@pytest.mark.parametrize(
    ("prefix", "kind"),
    [("vllm-live", "vllm"), ("llamacpp-live", "llamacpp")],
)
def test_texts_recorded_from_the_live_servers_give_a_section(prefix: str, kind: str) -> None:
    """Texts recorded by the live tests (PERFSCOPE_RECORD_FIXTURES=1) around one perfscope run
    of 64-token prompts and 32 output tokens."""
    before, after = _fixture(f"{prefix}-before.prom"), _fixture(f"{prefix}-after.prom")
    sec = server_metrics_section(_frame(before, after), {})
    assert sec.available and sec.server == kind
    gen = sec.tokens["generation"]
    assert gen is not None and gen > 0
    if kind == "vllm":
        n = sec.latency["ttft"].count
        assert n == 16 and gen == 16 * 32 and sec.tokens["prompt"] == 16 * 64
        assert sec.work.server_flops > 0
    else:
        assert sec.llamacpp.generation_s > 0
        assert sec.latency["tpot"].mean_s > 0
