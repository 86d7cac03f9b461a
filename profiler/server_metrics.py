"""Scrape an inference server's Prometheus ``/metrics`` endpoint during a run.

vLLM, SGLang, TGI and llama.cpp's ``llama-server`` (with ``--metrics``) export their own view
of every request: TTFT, inter-token latency, queue/prefill/decode time histograms, running and
waiting requests, KV-cache usage, prefix-cache and speculative-decoding counters. The
sampler here takes a snapshot at the start of the run, one every ``interval_s`` while it runs,
and one at the end, all stamped on the run's clock, and stores them as one long table
(``server_metrics.parquet``): one row per sample of one scrape.

Cost on the client: the HTTP GET runs on its own thread (the socket wait releases the GIL);
parsing keeps only the engine's own families and drops histogram buckets for the periodic
scrapes (the start and end snapshots keep everything), so a 50 kB vLLM page costs well under
a millisecond of interpreter time per scrape.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ENGINE_PREFIXES",
    "SERVER_METRICS_SCHEMA",
    "MetricSample",
    "ServerMetricsConfig",
    "ServerMetricsSampler",
    "detect_server",
    "format_labels",
    "metrics_url_for",
    "parse_prometheus_text",
    "read_server_metrics",
]

#: Metric-name prefix → server kind.
ENGINE_PREFIXES: dict[str, str] = {
    "vllm:": "vllm",
    "sglang:": "sglang",
    "tgi_": "tgi",
    "llamacpp:": "llamacpp",
}

#: One row per sample of one scrape. ``t``: run-clock nanoseconds when the response was read;
#: ``snapshot``: ``start`` | ``sample`` | ``end``; ``labels``: canonical ``k="v",...`` text.
SERVER_METRICS_SCHEMA = pa.schema(
    [
        ("t", pa.int64()),
        ("snapshot", pa.string()),
        ("name", pa.string()),
        ("labels", pa.string()),
        ("value", pa.float64()),
    ]
)


@dataclass(frozen=True)
class MetricSample:
    """One line of Prometheus text: ``name{labels} value``."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None."""
        for k, v in self.labels:
            if k == key:
                return v
        return None


def _unescape(text: str) -> str:
    return text.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    """``a="x",b="y"`` (escapes: ``\\\\``, ``\\"``, ``\\n``) → sorted pairs."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i >= n:
            break
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            raise ValueError(f"bad labels in {line!r}")
        key = text[i:eq].strip()
        j = eq + 2
        buf: list[str] = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                buf.append(text[j : j + 2])
                j += 2
            else:
                buf.append(text[j])
                j += 1
        if j >= n:
            raise ValueError(f"unterminated label value in {line!r}")
        out.append((key, _unescape("".join(buf))))
        i = j + 1
    return tuple(sorted(out))


def _parse_value(text: str) -> float:
    t = text.strip()
    low = t.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(t)


def parse_prometheus_text(
    text: str, *, keep: Callable[[str], bool] | None = None
) -> list[MetricSample]:
    """Samples of a Prometheus text exposition (format 0.0.4; OpenMetrics' ``# EOF`` ends it).

    Args:
        keep: filter on the sample name (e.g. drop ``_bucket``); None keeps every sample.

    Raises:
        ValueError: a sample line that is not ``name[{labels}] value [timestamp]``.
    """
    samples: list[MetricSample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            if line == "# EOF":
                break
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            close = line.rfind("}")
            if close < brace:
                raise ValueError(f"bad metric line {line!r}")
            if keep is not None and not keep(name):
                continue
            labels = _parse_labels(line[brace + 1 : close], line)
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name = parts[0]
            if keep is not None and not keep(name):
                continue
            labels = ()
            rest = parts[1:]
        if not rest:
            raise ValueError(f"metric line without a value: {line!r}")
        samples.append(MetricSample(name, labels, _parse_value(rest[0])))
    return samples


def format_labels(labels: Iterable[tuple[str, str]]) -> str:
    """Canonical text of a label set: ``k="v",...`` sorted by key, values escaped."""
    parts = []
    for k, v in sorted(labels):
        esc = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{k}="{esc}"')
    return ",".join(parts)


def detect_server(names: Iterable[str]) -> str | None:
    """The server kind whose metric prefix the most names carry (None: no known engine)."""
    counts: dict[str, int] = {}
    for name in names:
        for prefix, kind in ENGINE_PREFIXES.items():
            if name.startswith(prefix):
                counts[kind] = counts.get(kind, 0) + 1
                break
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: kv[1])[0]


def metrics_url_for(base_url: str) -> str:
    """The ``/metrics`` URL of the server behind an OpenAI API base (``.../v1`` dropped).

    Every engine listed in :data:`ENGINE_PREFIXES` serves ``/metrics`` at the root of the
    same host and port as its OpenAI API.
    """
    parts = urlsplit(base_url if "://" in base_url else "http://" + base_url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme or "http", netloc, "/metrics", "", ""))


def _engine_name(name: str) -> bool:
    return any(name.startswith(p) for p in ENGINE_PREFIXES)


def _keep_snapshot(name: str) -> bool:
    return not name.endswith("_created")


def _keep_periodic(name: str) -> bool:
    return _engine_name(name) and not name.endswith(("_bucket", "_created"))


@dataclass
class ServerMetricsConfig:
    """What ``--server-metrics`` asked for.

    Attributes:
        mode: ``auto`` (the engine's server, when it answers Prometheus text), ``url`` or
            ``off``.
        url: the endpoint for mode ``url``.
        interval_s: seconds between periodic scrapes (snapshots at start and end always).
        timeout_s: per-scrape HTTP limit in seconds.
    """

    mode: str = "auto"
    url: str | None = None
    interval_s: float = 1.0
    timeout_s: float = 2.0

    @classmethod
    def parse(cls, text: str | None, interval_s: float = 1.0) -> ServerMetricsConfig:
        """``auto`` | ``off`` | an http(s) URL (a bare ``host:port`` gets ``/metrics``).

        Raises:
            ValueError: anything else (the CLI turns it into a usage error).
        """
        value = (text or "auto").strip()
        if value.lower() in ("auto", "off"):
            return cls(mode=value.lower(), interval_s=interval_s)
        url = value if "://" in value else "http://" + value
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--server-metrics {text!r}: use auto, off or an http(s) URL")
        if parts.path in ("", "/"):
            url = urlunsplit((parts.scheme, parts.netloc, "/metrics", parts.query, ""))
        return cls(mode="url", url=url, interval_s=interval_s)


@dataclass
class _Scrape:
    t_ns: int
    snapshot: str
    samples: list[MetricSample]


#: Gauges (running, waiting, KV-cache use) are sampled at least this many times per run of a
#: second or more: a 1 s interval read "running max 0" during a short 16-stream run.
MIN_SAMPLES_PER_RUN = 10
#: ... and at most every 100 ms (each scrape costs the server a /metrics render).
FASTEST_INTERVAL_S = 0.1


@dataclass
class ServerMetricsSampler:
    """Scrapes ``url`` on a daemon thread; snapshots at :meth:`start` and :meth:`stop`.

    Args:
        url: the Prometheus endpoint.
        now_ns: the run clock (nanoseconds since the run's start).
        interval_s: the longest wait between periodic scrapes (s); shorter early in a run
            (see :meth:`next_interval_s`).
        timeout_s: HTTP limit per scrape.
    """

    url: str
    now_ns: Callable[[], int]
    interval_s: float = 1.0
    timeout_s: float = 2.0
    server: str | None = None
    errors: list[str] = field(default_factory=list)
    _scrapes: list[_Scrape] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _failures: int = 0
    _scrape_s: list[float] = field(default_factory=list)

    def _fetch(self) -> tuple[str, int]:
        req = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            body = resp.read()
        t_ns = self.now_ns()
        return body.decode("utf-8", errors="replace"), t_ns

    def _scrape(self, snapshot: str) -> bool:
        t0 = time.perf_counter()
        try:
            text, t_ns = self._fetch()
            keep = _keep_periodic if snapshot == "sample" else _keep_snapshot
            samples = parse_prometheus_text(text, keep=keep)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self._failures += 1
            if len(self.errors) < 5:
                self.errors.append(f"{snapshot} scrape of {self.url} failed: {exc}")
            return False
        with self._lock:
            self._scrapes.append(_Scrape(t_ns, snapshot, samples))
            self._scrape_s.append(time.perf_counter() - t0)
        return True

    def start(self) -> bool:
        """Take the start snapshot and, if it worked, start the periodic thread.

        Returns False (and records why in :attr:`errors`) when the endpoint does not answer
        with Prometheus text of a known engine; the run then goes on without server metrics.
        """
        if not self._scrape("start"):
            return False
        names = [s.name for s in self._scrapes[0].samples]
        self.server = detect_server(names)
        if self.server is None:
            self.errors.append(
                f"{self.url} answered, but with no vLLM, SGLang, TGI or llama.cpp metrics"
            )
        self._thread = threading.Thread(
            target=self._loop, name="perfscope-server-metrics", daemon=True
        )
        self._thread.start()
        return True

    def next_interval_s(self, elapsed_s: float) -> float:
        """Seconds to the next periodic scrape, ``elapsed_s`` into the run: fast enough for
        at least :data:`MIN_SAMPLES_PER_RUN` gauge samples in any run that lasts a second
        or more (elapsed / 20), never more often than :data:`FASTEST_INTERVAL_S` (unless
        ``interval_s`` asks for it), never slower than ``interval_s``."""
        fastest = min(self.interval_s, FASTEST_INTERVAL_S)
        return min(self.interval_s, max(fastest, elapsed_s / (2 * MIN_SAMPLES_PER_RUN)))

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.next_interval_s(time.monotonic() - t0)):
            self._scrape("sample")

    def stop(self) -> pa.Table:
        """Stop the thread, take the end snapshot and return every scrape as a table."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=self.timeout_s + 1.0)
            self._scrape("end")
        return self.table()

    def table(self) -> pa.Table:
        """All scrapes so far (SERVER_METRICS_SCHEMA)."""
        ts: list[int] = []
        kinds: list[str] = []
        names: list[str] = []
        labels: list[str] = []
        values: list[float] = []
        label_text: dict[tuple[tuple[str, str], ...], str] = {}
        with self._lock:
            scrapes = list(self._scrapes)
        for sc in scrapes:
            for s in sc.samples:
                text = label_text.get(s.labels)
                if text is None:
                    text = label_text[s.labels] = format_labels(s.labels)
                ts.append(sc.t_ns)
                kinds.append(sc.snapshot)
                names.append(s.name)
                labels.append(text)
                values.append(s.value)
        return pa.table(
            {"t": ts, "snapshot": kinds, "name": names, "labels": labels, "value": values},
            schema=SERVER_METRICS_SCHEMA,
        )

    def manifest_info(self) -> dict[str, Any]:
        """What the manifest records: URL, server kind, scrape counts and cost, errors."""
        with self._lock:
            n = len(self._scrapes)
            cost = sorted(self._scrape_s)
        return {
            "enabled": True,
            "url": self.url,
            "server": self.server,
            "interval_s": self.interval_s,
            "scrapes": n,
            "failed_scrapes": self._failures,
            "scrape_s_median": cost[len(cost) // 2] if cost else None,
            "errors": list(self.errors),
        }


def resolve_metrics_url(config: ServerMetricsConfig, engine_uri: str) -> str | None:
    """The endpoint to scrape for ``config`` and the run's engine (None: scrape nothing).

    ``auto`` scrapes only HTTP engines (``openai:URL``): the server's root ``/metrics``.
    """
    if config.mode == "off":
        return None
    if config.mode == "url":
        return config.url
    scheme, _, rest = engine_uri.partition(":")
    if scheme != "openai" or not rest.strip():
        return None
    return metrics_url_for(rest.strip())


def start_server_metrics(
    config: ServerMetricsConfig, engine_uri: str, now_ns: Callable[[], int]
) -> tuple[ServerMetricsSampler | None, dict[str, Any]]:
    """Start sampling for a run; returns the sampler (None when off or unreachable) and the
    manifest entry (``enabled`` false with the ``reason`` when nothing is sampled).

    In ``auto`` mode an endpoint that does not answer is not an error (many servers have
    none); an explicit URL that does not answer is reported in the manifest's reason.
    """
    url = resolve_metrics_url(config, engine_uri)
    if url is None:
        reason = "off" if config.mode == "off" else "the engine is not an HTTP server"
        return None, {"enabled": False, "mode": config.mode, "reason": reason}
    sampler = ServerMetricsSampler(
        url, now_ns, interval_s=config.interval_s, timeout_s=config.timeout_s
    )
    if not sampler.start():
        info = {
            "enabled": False,
            "mode": config.mode,
            "url": url,
            "reason": "; ".join(sampler.errors) or "no answer",
        }
        return None, info
    info = sampler.manifest_info()
    info["mode"] = config.mode
    return sampler, info


def read_server_metrics(run_dir: Path) -> pd.DataFrame | None:
    """``run_dir/server_metrics.parquet`` as a frame; ``None`` when the run has none or the
    file cannot be read (the analysis then says the section is unavailable)."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "server_metrics.parquet"
    if not path.is_file():
        return None
    try:
        frame: pd.DataFrame = pq.read_table(path).to_pandas()
    except (OSError, pa.ArrowInvalid):
        return None
    return frame
