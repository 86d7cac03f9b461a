#!/usr/bin/env python3
"""How far are a load generator's TTFT/TPOT/E2E from the wire?

Starts a real server on loopback (the scripted SSE server, llama.cpp's ``llama-server`` or vLLM
CPU, the builds that ``.ci/run`` caches), captures the loopback traffic with ``tcpdump -i lo``
(nanosecond stamps), runs perfscope (in each stamping mode, ``--transports``), the peers
AIPerf and guidellm (``--aiperf EXE``, ``--guidellm EXE``; each skipped with a note when not
found) and ``vllm bench serve`` (when vLLM is there) against it, each on its own capture, and
compares each request's client-side numbers with the same request's on the wire:

- wire send: the packet that carried the request's last byte;
- wire first token: the packet that completed the first SSE event carrying a token (text, or a
  ``usage.completion_tokens`` increase); wire last token: the same for the last such event;
- wire TTFT = first − send, TPOT = (last − first) / (tokens − 1), E2E = last − send.

perfscope's requests are matched to wire requests by their send, first-token and last-token
times (one offset between the run clock and the capture clock, from the manifest's start
time). AIPerf's and guidellm's records carry each request's prompt, start stamp (realtime, the
capture's clock), TTFT and latency: each is matched to the wire request that carried its prompt
text. ``vllm bench serve`` stores no per-request start times: its run means are compared with
the wire means of its own capture.

Reruns (need root for tcpdump; every run bounded in requests and time)::

    python scripts/wire_accuracy.py scripted --loads 16,256 --runs 2 \
        --aiperf /tmp/peer-aiperf/bin/aiperf --guidellm /tmp/peer-guidellm/bin/guidellm
    python scripts/wire_accuracy.py vllm --loads 16,48 --runs 2 --aiperf ... --guidellm ...
    python scripts/wire_accuracy.py all --out /tmp/wire   # llama.cpp (perfscope only), vLLM

Prints the tables of docs/wire.md and writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live_servers import find_llama_server, find_vllm, free_port  # noqa: E402

# --------------------------------------------------------------------------- pcap + TCP


@dataclass
class _Dir:
    """One direction of one TCP connection: payload bytes and when each segment arrived."""

    segments: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, t_ns, data)
    data: bytes = b""
    ends: list[int] = field(default_factory=list)  # byte offset after each segment
    times: list[int] = field(default_factory=list)
    #: Byte offsets where the capture has a hole (a segment the kernel dropped).
    gaps: list[int] = field(default_factory=list)

    def assemble(self) -> None:
        """Order by sequence number, drop retransmitted bytes."""
        if not self.segments:
            return
        self.segments.sort(key=lambda s: (s[0], s[1]))
        base = self.segments[0][0]
        buf = bytearray()
        for seq, t, payload in self.segments:
            off = (seq - base) & 0xFFFFFFFF
            if off + len(payload) <= len(buf):
                continue
            if off > len(buf):
                self.gaps.append(len(buf))
            payload = payload[len(buf) - off :] if off < len(buf) else payload
            buf += payload
            self.ends.append(len(buf))
            self.times.append(t)
        self.data = bytes(buf)

    def time_of(self, offset: int) -> int:
        """Capture time (ns) of the packet that carried byte ``offset``."""
        i = bisect.bisect_right(self.ends, offset)
        return self.times[min(i, len(self.times) - 1)]


def read_pcap(path: Path, server_port: int) -> dict[int, tuple[_Dir, _Dir]]:
    """Client port → (client→server, server→client) streams of a nanosecond pcap."""
    raw = path.read_bytes()
    magic = struct.unpack("<I", raw[:4])[0]
    if magic == 0xA1B23C4D:
        endian, scale = "<", 1
    elif magic == 0xA1B2C3D4:
        endian, scale = "<", 1000
    else:
        raise ValueError(f"{path}: not a little-endian pcap file")
    linktype = struct.unpack(endian + "I", raw[20:24])[0]
    conns: dict[int, tuple[_Dir, _Dir]] = {}
    pos = 24
    while pos + 16 <= len(raw):
        sec, frac, incl, _ = struct.unpack(endian + "IIII", raw[pos : pos + 16])
        pkt = raw[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        t = sec * 1_000_000_000 + frac * scale
        if linktype == 1:  # Ethernet
            if struct.unpack("!H", pkt[12:14])[0] != 0x0800:
                continue
            ip = pkt[14:]
        elif linktype == 113:  # Linux cooked
            ip = pkt[16:]
        else:
            ip = pkt[4:] if linktype == 0 else pkt
        if not ip or ip[0] >> 4 != 4 or ip[9] != 6:
            continue
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        tcp = ip[ihl:total]
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        doff = (tcp[12] >> 4) * 4
        payload = tcp[doff:]
        if not payload:
            continue
        if dport == server_port:
            conns.setdefault(sport, (_Dir(), _Dir()))[0].segments.append((seq, t, payload))
        elif sport == server_port:
            conns.setdefault(dport, (_Dir(), _Dir()))[1].segments.append((seq, t, payload))
    for c2s, s2c in conns.values():
        c2s.assemble()
        s2c.assemble()
    return conns


# --------------------------------------------------------------------------- HTTP + SSE


@dataclass
class WireRequest:
    """One streamed completion on the wire (capture-clock nanoseconds)."""

    port: int
    t_sent: int
    t_first: int | None
    t_last: int | None
    tokens: int
    status: int
    first_empty: bool = False
    #: The request's prompt text (``prompt``, or the last message's text): peers are matched
    #: to wire requests by it.
    prompt: str | None = None
    #: The capture holds the whole stream (it ends with ``data: [DONE]`` and the token events
    #: found match the server's final count). A capture that dropped packets loses events:
    #: its last-token time is early, so E2E and TPOT are compared only on complete streams.
    complete: bool = True

    @property
    def ttft(self) -> float | None:
        return (self.t_first - self.t_sent) * 1e-9 if self.t_first is not None else None

    @property
    def e2e(self) -> float | None:
        return (self.t_last - self.t_sent) * 1e-9 if self.t_last is not None else None

    @property
    def tpot(self) -> float | None:
        if self.t_first is None or self.t_last is None or self.tokens < 2:
            return None
        return (self.t_last - self.t_first) * 1e-9 / (self.tokens - 1)


def _requests(c2s: _Dir) -> list[tuple[str, int, bytes]]:
    """(method + path, time of the last byte, body) of each HTTP request on a connection."""
    out, pos, data = [], 0, c2s.data
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        head = data[pos:end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        last = end + 4 + length - 1
        body = data[end + 4 : last + 1]
        out.append((" ".join(head.split(" ", 2)[:2]), c2s.time_of(last), body))
        pos = last + 1
    return out


def prompt_text(body: Any) -> str | None:
    """The prompt of a completions request body (JSON text or object): ``prompt``, or the
    text of the last chat message (a string or a list of text parts)."""
    if isinstance(body, bytes | str):
        try:
            body = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("prompt"), str):
        return str(body["prompt"])
    messages = body.get("messages") or []
    if not messages:
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content) if content is not None else None


def _responses(s2c: _Dir) -> list[tuple[int, list[tuple[bytes, int]], bool]]:
    """(status, [(SSE event, time of its last byte)], whole) of each HTTP response; ``whole``
    is false when the capture has a hole inside the response's bytes."""
    out: list[tuple[int, list[tuple[bytes, int]], bool]] = []
    pos, data = 0, s2c.data
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        start = pos
        head = data[pos:end].decode("latin-1").lower()
        status = int(head.split(" ", 2)[1])
        body_start = end + 4
        # Decoded body bytes with their raw offsets.
        body = bytearray()
        raw_off: list[int] = []
        if "transfer-encoding: chunked" in head:
            p = body_start
            while True:
                nl = data.find(b"\r\n", p)
                if nl < 0:
                    p = len(data)
                    break
                size = int(data[p:nl].split(b";")[0] or b"0", 16)
                p = nl + 2
                if size == 0:
                    p += 2
                    break
                body += data[p : p + size]
                raw_off.extend(range(p, p + size))
                p += size + 2
            pos = p
        else:
            length = None
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            stop = len(data) if length is None else body_start + length
            body += data[body_start:stop]
            raw_off.extend(range(body_start, stop))
            pos = stop
        events = []
        b = bytes(body).replace(b"\r\n", b"\n")
        # Offsets shift when \r\n is folded; SSE from these servers uses \n only.
        i = 0
        while True:
            j = b.find(b"\n\n", i)
            if j < 0:
                break
            ev = b[i:j]
            off = raw_off[min(j + 1, len(raw_off) - 1)] if raw_off else body_start
            events.append((ev, s2c.time_of(off)))
            i = j + 2
        whole = not any(start <= g < pos for g in s2c.gaps)
        out.append((status, events, whole))
    return out


def _stream_done(events: list[tuple[bytes, int]]) -> bool:
    """Whether the capture holds the stream's end: ``data: [DONE]`` (vLLM), or a last event
    whose choice has a ``finish_reason`` (llama.cpp sends no ``[DONE]``)."""
    if not events:
        return False
    last = events[-1][0].strip()
    if last == b"data: [DONE]":
        return True
    try:
        obj = json.loads(last.decode("utf-8", errors="replace").removeprefix("data:"))
    except json.JSONDecodeError:
        return False
    return any(c.get("finish_reason") for c in (obj.get("choices") or []))


def _token_events(events: list[tuple[bytes, int]]) -> tuple[list[int], int, bool]:
    """Times of events that carry a token, and the token count (usage where given).

    A usage increase marks a token only when the server sends usage with every chunk (vLLM's
    continuous usage); a usage that comes once, at the end (llama.cpp), marks none.
    """
    parsed: list[tuple[dict[str, Any], int]] = []
    for ev, t in events:
        text = ev.decode("utf-8", errors="replace")
        if not text.startswith("data:"):
            continue
        payload = text[5:].strip()
        if payload == "[DONE]":
            continue
        try:
            parsed.append((json.loads(payload), t))
        except json.JSONDecodeError:
            continue
    continuous = sum(1 for o, _ in parsed if o.get("usage") and o.get("choices")) > 1
    times: list[int] = []
    first_empty = False
    prev_usage = 0
    final_usage = None
    for obj, t in parsed:
        usage = (obj.get("usage") or {}).get("completion_tokens")
        choices = obj.get("choices") or []
        has_text = any(
            (c.get("text") or (c.get("delta") or {}).get("content") or "") for c in choices
        )
        grew = continuous and usage is not None and usage > prev_usage and bool(choices)
        # Without per-chunk usage (a client that did not ask for it), every chunk with a
        # choice and no finish_reason is one token, text or not (vLLM, llama.cpp).
        bare = (
            not continuous
            and bool(choices)
            and all(c.get("finish_reason") is None for c in choices)
        )
        if has_text or grew or bare:
            if not times:
                first_empty = not has_text
            times.append(t)
        if usage is not None:
            if choices:
                prev_usage = usage
            final_usage = usage
    return times, (final_usage if final_usage is not None else len(times)), first_empty


def wire_requests(pcap: Path, port: int) -> list[WireRequest]:
    """Every streamed POST in the capture, with its token times."""
    out = []
    for cport, (c2s, s2c) in read_pcap(pcap, port).items():
        reqs, resps = _requests(c2s), _responses(s2c)
        for (what, t_sent, body), (status, events, whole) in zip(reqs, resps, strict=False):
            if not what.startswith("POST") or "completions" not in what:
                continue
            times, n, first_empty = _token_events(events)
            complete = whole and _stream_done(events)
            out.append(
                WireRequest(
                    cport,
                    t_sent,
                    times[0] if times else None,
                    times[-1] if times else None,
                    n,
                    status,
                    first_empty,
                    prompt=prompt_text(body),
                    complete=complete,
                )
            )
    return sorted(out, key=lambda w: w.t_sent)


# --------------------------------------------------------------------------- capture


class Capture:
    """``tcpdump -i lo`` of one TCP port into a pcap file (nanosecond stamps)."""

    def __init__(self, port: int, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [
                "tcpdump",
                "-i",
                "lo",
                "-s",
                "0",
                "-B",
                "65536",
                "--time-stamp-precision=nano",
                "-U",  # each packet written as it is taken: stop() can see the file settle
                "-w",
                str(path),
                "tcp",
                "port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # tcpdump needs a moment before it captures
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise RuntimeError(f"tcpdump failed: {err.strip()}")

    def stop(self, settle_s: float = 1.0, most_s: float = 15.0) -> Path:
        """Stop once the capture file has not grown for ``settle_s`` (at most ``most_s``): on a
        busy machine tcpdump reads its buffer late, and packets it has not read when it is
        interrupted are lost (the tails of the last streams)."""
        deadline, last, since = time.monotonic() + most_s, -1, time.monotonic()
        while time.monotonic() < deadline:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size != last:
                last, since = size, time.monotonic()
            elif time.monotonic() - since >= settle_s:
                break
            time.sleep(0.1)
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=10)
        #: tcpdump's own count of packets the kernel dropped (its exit report).
        self.dropped = 0
        for line in err.decode(errors="replace").splitlines():
            if "dropped by kernel" in line:
                self.dropped = int(line.split()[0])
        return self.path


# --------------------------------------------------------------------------- tools


def _stats(values: list[float]) -> dict[str, float | None]:
    import numpy as np

    if not values:
        return {"mean": None, "p50": None, "p99": None, "n": 0}
    a = np.asarray(values, dtype=float)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "n": len(a),
    }


def run_perfscope(
    base: str,
    tokenizer: Path | None,
    load: list[str],
    n: int,
    out: Path,
    transport: str = "auto",
    timeout_s: float = 600.0,
) -> Path:
    """One bounded ``perfscope run`` (``transport``: kernel, aiohttp or auto); its run dir."""
    runs = out / "runs"
    cmd = [
        sys.executable,
        "-m",
        "perfscope",
        "run",
        f"openai:{base}",
        *(("--tokenizer", str(tokenizer)) if tokenizer is not None else ()),
        "--engine-opt",
        f"transport={transport}",
        "--timeout",
        "120",
        "--prompt-len",
        "64",
        "--output-len",
        "32",
        "--requests",
        str(n),
        *load,
        "--no-progress",
        "--no-report",
        "--no-telemetry",
        "--server-metrics",
        "off",
        "--json",
        "--runs-dir",
        str(runs),
    ]
    before = set(runs.iterdir()) if runs.exists() else set()
    proc = subprocess.run(
        cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s
    )
    new_dirs = set(runs.iterdir()) - before if runs.exists() else set()
    if len(new_dirs) != 1:
        raise SystemExit(f"perfscope run failed: {proc.stderr.decode(errors='replace')[-800:]}")
    (new,) = new_dirs
    return new


def compare_perfscope(run_dir: Path, wire: list[WireRequest]) -> dict[str, Any]:
    """Per-request client − wire errors of one perfscope run (seconds)."""
    import pandas as pd

    manifest = json.loads((run_dir / "manifest.json").read_text())
    client = ((manifest.get("engine") or {}).get("config") or {}).get("client") or {}
    stall = client.get("stall") or {}
    req = pd.read_parquet(run_dir / "requests.parquet")
    req = req[req["error"].isna() & ~req["is_warmup"].astype(bool)]
    origin = int(datetime.fromisoformat(manifest["started_at"]).timestamp() * 1e9)
    # The preflight request goes out before the run clock starts: not a run request.
    good = [w for w in wire if w.t_first is not None and w.status == 200 and w.t_sent > origin]
    # Greedy matching on |send| + |first| + |last| distance (offset from the manifest).
    pairs = []
    for i, r in enumerate(req.itertuples()):
        for j, w in enumerate(good):
            cost = (
                abs(origin + r.t_sent - w.t_sent)
                + abs(origin + r.t_first_token - (w.t_first or 0))
                + abs(origin + r.t_last_token - (w.t_last or 0))
            )
            pairs.append((cost, i, j))
    pairs.sort()
    used_i: set[int] = set()
    used_j: set[int] = set()
    errs: dict[str, list[float]] = {
        "ttft": [],
        "tpot": [],
        "e2e": [],
        "send": [],
        "ttft_text_first": [],
        "ttft_empty_first": [],
    }
    rows = list(req.itertuples())
    incomplete = 0
    for cost, i, j in pairs:
        if i in used_i or j in used_j:
            continue
        if cost > 300_000_000:  # no wire request within 0.1 s per stamp: not captured
            break
        used_i.add(i)
        used_j.add(j)
        r, w = rows[i], good[j]
        ttft = (r.t_first_token - r.t_sent) * 1e-9
        e2e = (r.t_last_token - r.t_sent) * 1e-9
        errs["ttft"].append(ttft - (w.ttft or 0))
        key = "ttft_empty_first" if w.first_empty else "ttft_text_first"
        errs[key].append(ttft - (w.ttft or 0))
        errs["send"].append((w.t_sent - origin - r.t_sent) * 1e-9)
        if not w.complete:
            incomplete += 1
            continue
        errs["e2e"].append(e2e - (w.e2e or 0))
        if r.output_tokens > 1 and w.tpot is not None:
            tpot = (r.t_last_token - r.t_first_token) * 1e-9 / (r.output_tokens - 1)
            errs["tpot"].append(tpot - w.tpot)
    cont = (manifest.get("host") or {}).get("contention") or {}
    capacity = (cont.get("window_s") or 0.0) * (cont.get("cpu_count") or 0)
    return {
        # Shares of the machine's CPU capacity during the run (perfscope's contention meter).
        "server_cpu_share": cont["server_cpu_s"] / capacity
        if capacity and cont.get("server_cpu_s") is not None
        else None,
        "others_cpu_share": cont.get("others_share"),
        "stamp_clock": client.get("stamp_clock"),
        "stall_worst_s": stall.get("worst_s"),
        "stall_affected": stall.get("affected"),
        "client_cpu_s": client.get("cpu_s"),
        "matched": len(used_i),
        "client_requests": len(req),
        "wire_requests": len(good),
        "incomplete_captures": incomplete,
        "errors": {k: _stats(v) for k, v in errs.items()},
    }


def _pcap_server_port(pcap: Path) -> int:
    """The capture's server port: the run's base URL names it (first POST's destination)."""
    raw = pcap.read_bytes()
    pos = 24
    while pos + 16 <= len(raw):
        incl = struct.unpack("<I", raw[pos + 8 : pos + 12])[0]
        pkt = raw[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        ip = pkt[14:]
        ihl = (ip[0] & 0x0F) * 4
        tcp = ip[ihl:]
        if b"POST " in tcp[(tcp[12] >> 4) * 4 :][:5]:
            return int(struct.unpack("!H", tcp[2:4])[0])
    raise ValueError(f"{pcap}: no POST found")


def wire_means(wire: list[WireRequest]) -> dict[str, float | None]:
    good = [w for w in wire if w.t_first is not None and w.status == 200]
    out: dict[str, float | None] = {}
    for key in ("ttft", "tpot", "e2e"):
        use = good if key == "ttft" else [w for w in good if w.complete]
        vals = [getattr(w, key) for w in use if getattr(w, key) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    return out


def run_vllm_bench(
    vllm: str, base: str, model_dir: Path, load: list[str], n: int, out: Path
) -> dict[str, float]:
    res = out / "bench"
    res.mkdir(parents=True, exist_ok=True)
    name = f"bench-{time.time_ns()}.json"
    cmd = [
        vllm,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        base.removesuffix("/v1"),
        "--model",
        "tiny-llama",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        "64",
        "--random-output-len",
        "32",
        "--num-prompts",
        str(n),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--ready-check-timeout-sec",
        "0",
        "--save-result",
        "--result-dir",
        str(res),
        "--result-filename",
        name,
        *load,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=600
    )
    data = json.loads((res / name).read_text())
    return {
        "ttft": data["mean_ttft_ms"] * 1e-3,
        "tpot": data["mean_tpot_ms"] * 1e-3,
        "e2e": data["mean_e2el_ms"] * 1e-3 if "mean_e2el_ms" in data else float("nan"),
    }


# --------------------------------------------------------------------------- peers


@dataclass
class PeerRequest:
    """One request as a peer load generator recorded it.

    ``t_start``: its own start stamp, CLOCK_REALTIME ns (the capture's clock); ``ttft`` and
    ``e2e``: its own first-token and request latencies, seconds; ``prompt``: the prompt text it
    sent (matched to the wire request carrying the same text)."""

    prompt: str | None
    t_start: int
    ttft: float | None
    e2e: float | None
    ok: bool


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished, waited-for children."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


def _run_peer(cmd: list[str], folder: Path, timeout_s: float) -> float:
    """Run a peer's command (its output to ``folder/stdout.log``), bounded by ``timeout_s``;
    the CPU seconds it and its children took."""
    env = dict(os.environ)
    # AIPerf caches the tokenizer through the hub API even for a local folder.
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("PYTHONPATH", None)
    cpu0 = _children_cpu_s()
    with (folder / "stdout.log").open("wb") as log:
        subprocess.run(
            cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s
        )
    return _children_cpu_s() - cpu0


def run_aiperf(
    exe: str, url: str, model: str, tokenizer: Path, c: int, n: int, out: Path, timeout_s: float
) -> tuple[list[PeerRequest], float]:
    """One bounded ``aiperf profile`` run (chat, streaming, ``c`` streams, ``n`` requests,
    64 prompt / 32 output tokens); its requests and the CPU seconds it took."""
    art = out / f"aiperf-{time.time_ns()}"
    art.mkdir(parents=True)
    cmd = [
        *(exe, "profile", "--model", model, "--url", url, "--endpoint-type", "chat"),
        *("--streaming", "--concurrency", str(c), "--request-count", str(n)),
        *("--synthetic-input-tokens-mean", "64", "--synthetic-input-tokens-stddev", "0"),
        *("--output-tokens-mean", "32", "--output-tokens-stddev", "0"),
        *("--extra-inputs", "ignore_eos:true", "--tokenizer", str(tokenizer)),
        *("--use-server-token-count", "--artifact-dir", str(art), "--ui", "none"),
        *("--no-server-metrics", "--no-gpu-telemetry"),
    ]
    cpu = _run_peer(cmd, art, timeout_s)
    inputs = json.loads((art / "inputs.json").read_text())["data"]
    prompts = {d["session_id"]: prompt_text(d["payloads"][0]) for d in inputs}
    reqs = []
    for line in (art / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        meta, metrics = rec["metadata"], rec.get("metrics") or {}
        ttft = (metrics.get("time_to_first_token") or {}).get("value")
        lat = (metrics.get("request_latency") or {}).get("value")
        reqs.append(
            PeerRequest(
                prompts.get(meta.get("conversation_id")),
                int(meta["request_start_ns"]),
                ttft * 1e-3 if ttft is not None else None,
                lat * 1e-3 if lat is not None else None,
                rec.get("error") is None and ttft is not None,
            )
        )
    return reqs, cpu


def run_guidellm(
    exe: str, url: str, model: str, tokenizer: Path, c: int, n: int, out: Path, timeout_s: float
) -> tuple[list[PeerRequest], float]:
    """One bounded ``guidellm run`` (chat, streaming, ``c`` concurrent streams, ``n``
    requests, 64 prompt / 32 output tokens); its requests and the CPU seconds it took."""
    res = out / f"guidellm-{time.time_ns()}"
    res.mkdir(parents=True)
    backend = (
        f"kind=openai_http,target={url},model={model},"
        "request_format=/v1/chat/completions,validate_backend=false"
    )
    cmd = [
        *(exe, "run", "--backend", backend, "--profile", f"kind=concurrent,streams={c}"),
        *("--constraint", f"kind=max_requests,count={n}"),
        *("--tokenizer", f"kind=huggingface_auto,model={tokenizer}"),
        *("--data", "kind=synthetic_text,prompt_tokens=64,output_tokens=32"),
        *("--output", f"kind=json,path={res / 'benchmarks.json'}"),
        "--disable-console-interactive",
    ]
    cpu = _run_peer(cmd, res, timeout_s)
    bench = json.loads((res / "benchmarks.json").read_text())["benchmarks"][0]["requests"]
    reqs = []
    for kind in ("successful", "errored", "incomplete"):
        for r in bench.get(kind) or ():
            body = (json.loads(r["request_args"]) if r.get("request_args") else {}).get("body")
            ttft = r.get("time_to_first_token_ms")
            reqs.append(
                PeerRequest(
                    prompt_text(body) if body is not None else None,
                    int(r["request_start_time"] * 1e9),
                    ttft * 1e-3 if ttft is not None else None,
                    r.get("request_latency"),
                    kind == "successful" and ttft is not None,
                )
            )
    return reqs, cpu


PEERS = {"aiperf": run_aiperf, "guidellm": run_guidellm}


def compare_peer(reqs: list[PeerRequest], wire: list[WireRequest]) -> dict[str, Any]:
    """Per-request peer − wire errors (seconds): each request is matched to the wire request
    that carried its prompt text (the nearest send among equal prompts)."""
    by_prompt: dict[str, list[WireRequest]] = {}
    for w in wire:
        if w.t_first is not None and w.status == 200 and w.prompt is not None:
            by_prompt.setdefault(w.prompt, []).append(w)
    n_wire = sum(len(v) for v in by_prompt.values())
    errs: dict[str, list[float]] = {"ttft": [], "e2e": [], "send": []}
    matched = failed = 0
    for r in reqs:
        if not r.ok or r.ttft is None:
            failed += 1
            continue
        cands = by_prompt.get(r.prompt or "")
        if not cands:
            continue
        w = min(cands, key=lambda x: abs(x.t_sent - r.t_start))
        cands.remove(w)
        matched += 1
        errs["ttft"].append(r.ttft - (w.ttft or 0.0))
        errs["send"].append((w.t_sent - r.t_start) * 1e-9)
        if w.complete and r.e2e is not None and w.e2e is not None:
            errs["e2e"].append(r.e2e - w.e2e)
    return {
        "matched": matched,
        "client_requests": len(reqs),
        "wire_requests": n_wire,
        "failed": failed,
        "errors": {k: _stats(v) for k, v in errs.items()},
    }


def measure_peer(
    peer: str,
    exe: str,
    label: str,
    port: int,
    url: str,
    model: str,
    tokenizer: Path,
    c: int,
    n: int,
    out: Path,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """One peer run on its own loopback capture, compared per request with the wire."""
    slug = "".join(ch if ch.isalnum() else "_" for ch in label)
    cap = Capture(port, out / f"{peer}-{slug}-{time.time_ns()}.pcap")
    try:
        reqs, cpu = PEERS[peer](exe, url, model, tokenizer, c, n, out, timeout_s)
    finally:
        pcap = cap.stop()
    row: dict[str, Any] = {"load": label, "requests": n, "tool": peer, "pcap": str(pcap)}
    row["peer"] = compare_peer(reqs, wire_requests(pcap, port))
    row["process_cpu_s"] = cpu
    row["capture_dropped_packets"] = cap.dropped
    return row


def peer_tokenizer(out: Path) -> Path:
    """A Hugging Face tokenizer folder (the tests' trained tokenizer, a chat template) for the
    peers' ``--tokenizer`` on the scripted server."""
    from transformers import PreTrainedTokenizerFast

    from tests.live_models import train_tokenizer

    path = out / "peer-tokenizer"
    hf = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    hf.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    hf.save_pretrained(path)
    return path


def find_peers(args: argparse.Namespace) -> dict[str, str]:
    """Peer name → executable, from ``--aiperf`` / ``--guidellm`` or PATH; a note for each
    one not found (it is skipped)."""
    import shutil

    found = {}
    for name in PEERS:
        given = getattr(args, name)
        exe = given or shutil.which(name)
        if exe and Path(exe).is_file() and os.access(exe, os.X_OK):
            found[name] = str(exe)
        else:
            where = f"{given} is not an executable" if given else f"no {name} on PATH"
            print(f"note: {name} skipped ({where}; give --{name} PATH)", file=sys.stderr)
    return found


# --------------------------------------------------------------------------- servers


def start_scripted() -> tuple[subprocess.Popen[bytes], int]:
    """The scripted SSE server (tests/data/openai/sse_server.py): TTFT 30 ms, ITL 10 ms."""
    server = ROOT / "tests" / "data" / "openai" / "sse_server.py"
    proc = subprocess.Popen(
        [sys.executable, str(server), "--port", "0", "--ttft", "0.03", "--itl", "0.01"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        raise SystemExit(f"scripted server did not start: {line!r}")
    return proc, int(line.split()[1])


def start_llama(out: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    from tests.live_models import build_gguf, save_tokenizer

    binary = find_llama_server()
    if binary is None:
        raise SystemExit("llama-server not found (run .ci/run or set PERFSCOPE_LLAMA_SERVER)")
    model = build_gguf(out / "tiny.gguf")
    tok = save_tokenizer(out / "tokenizer")
    port = free_port()
    log = (out / "llama-server.log").open("wb")
    proc = subprocess.Popen(
        [
            *(binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port)),
            *("--parallel", "4", "--cont-batching", "--metrics", "-c", "2048", "-t", "1"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    _wait(f"http://127.0.0.1:{port}/health", 60)
    return proc, port, tok


def start_vllm(out: Path) -> tuple[subprocess.Popen[bytes], int, Path, str]:
    from tests.live_models import build_hf_llama

    vllm = find_vllm()
    if vllm is None:
        raise SystemExit("vLLM not found (run .ci/run or set PERFSCOPE_VLLM)")
    model = build_hf_llama(out / "hf-model")
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    log = (out / "vllm.log").open("wb")
    proc = subprocess.Popen(
        [
            *(vllm, "serve", str(model), "--served-model-name", "tiny-llama"),
            *("--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16"),
            *("--max-model-len", "512", "--max-num-seqs", "64", "--seed", "0"),
            "--disable-uvicorn-access-log",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        _wait(f"http://127.0.0.1:{port}/health", 900)
    except SystemExit:
        _stop(proc)  # never leave a server that did not come up running
        raise
    return proc, port, model, vllm


def _wait(url: str, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


# --------------------------------------------------------------------------- main


def measure(
    label: str,
    port: int,
    base: str,
    tokenizer: Path,
    load: list[str],
    n: int,
    out: Path,
    bench: tuple[str, Path, list[str]] | None,
    transport: str = "auto",
) -> dict[str, Any]:
    row: dict[str, Any] = {"load": label, "requests": n, "transport": transport}
    slug = "".join(ch if ch.isalnum() else "_" for ch in label)
    cap = Capture(port, out / f"{slug}-{transport}-{time.time_ns()}.pcap")
    cpu0 = _children_cpu_s()
    try:
        run_dir = run_perfscope(base, tokenizer, load, n, out, transport)
    finally:
        pcap = cap.stop()
    row["process_cpu_s"] = _children_cpu_s() - cpu0
    wire = wire_requests(pcap, port)
    row["pcap"], row["run_dir"] = str(pcap), str(run_dir)
    row["perfscope"] = compare_perfscope(run_dir, wire)
    row["wire_means"] = wire_means(wire)
    summary = json.loads((run_dir / "summary.json").read_text())
    row["perfscope"]["failed"] = summary["counts"]["failed"]
    row["capture_dropped_packets"] = cap.dropped
    if bench is not None:
        vllm, model_dir, bench_load = bench
        cap = Capture(port, out / f"bench-{slug}-{time.time_ns()}.pcap")
        try:
            means = run_vllm_bench(vllm, base, model_dir, bench_load, n, out)
        finally:
            pcap = cap.stop()
        w = wire_means(wire_requests(pcap, port))
        row["bench_pcap"], row["bench_means"] = str(pcap), means
        row["vllm_bench"] = {
            k: (means[k] - w[k]) if w[k] is not None else None for k in ("ttft", "tpot", "e2e")
        }
    return row


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e3:+.3f}"


def print_tables(rows: list[dict[str, Any]]) -> None:
    print(
        "| server | load | stamps | runs × requests | lost | client stall max | "
        "TTFT − wire mean (p50 / p99) | "
        "TTFT − wire, text-first requests | empty-first requests: n, TTFT − wire | "
        "TPOT − wire mean | E2E − wire mean (p99) | wire send − send stamp | vllm bench "
        "TTFT / TPOT − wire |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if "perfscope" not in r:
            continue
        clock = r["perfscope"].get("stamp_clock") or r.get("transport") or "?"
        groups.setdefault((r["server"], r["load"], clock), []).append(r)
    for (server, load, clock), rs in groups.items():
        import numpy as np

        def pooled(key: str, stat: str, rs: list[dict[str, Any]] = rs) -> float | None:
            pairs = [
                (r["perfscope"]["errors"][key][stat], r["perfscope"]["errors"][key]["n"])
                for r in rs
            ]
            pairs = [(v, n) for v, n in pairs if v is not None and n]
            if not pairs:
                return None
            if stat == "mean":  # weighted by requests
                return float(sum(v * n for v, n in pairs) / sum(n for _, n in pairs))
            return float(np.mean([v for v, _ in pairs]))

        n_empty = sum(int(r["perfscope"]["errors"]["ttft_empty_first"]["n"]) for r in rs)

        lost = sum(int(r["perfscope"]["failed"]) for r in rs)
        total = sum(int(r["requests"]) for r in rs)
        bench = ""
        if "vllm_bench" in rs[0]:
            b = rs[0]["vllm_bench"]
            bench = f"{_fmt(b['ttft'])} / {_fmt(b['tpot'])}"
        stalls = [r["perfscope"].get("stall_worst_s") for r in rs]
        stall = max((x for x in stalls if x is not None), default=None)
        print(
            f"| {server} | {load} | {clock} | {len(rs)} × {rs[0]['requests']} | {lost}/{total} | "
            f"{_fmt(stall)} | "
            f"{_fmt(pooled('ttft', 'mean'))} ({_fmt(pooled('ttft', 'p50'))} / "
            f"{_fmt(pooled('ttft', 'p99'))}) | {_fmt(pooled('ttft_text_first', 'mean'))} | "
            f"{n_empty}, {_fmt(pooled('ttft_empty_first', 'mean'))} | "
            f"{_fmt(pooled('tpot', 'mean'))} | "
            f"{_fmt(pooled('e2e', 'mean'))} ({_fmt(pooled('e2e', 'p99'))}) | "
            f"{_fmt(pooled('send', 'mean'))} | {bench or '—'} |"
        )
    print("(milliseconds; positive = the client reports more than the wire)")
    incomplete = sum(
        int(r["perfscope"].get("incomplete_captures", 0)) for r in rows if "perfscope" in r
    )
    if incomplete:
        print(
            f"({incomplete} matched requests whose capture lost packets are left out of the "
            "E2E and TPOT columns: their wire last-token time is early)"
        )


def print_compact(rows: list[dict[str, Any]]) -> None:
    """The table of docs/wire.md: one row per server, load and client (perfscope in each
    stamping mode, the peers), each cell the runs in order, ``run 1 / run 2 / ...``
    (milliseconds; positive = the client reports more than the wire, or its start stamp was
    taken before the wire send)."""
    groups: dict[tuple[str, str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in rows:
        if "peer" in r:
            name, res = r["tool"], r["peer"]
        else:
            res = r["perfscope"]
            clock = res.get("stamp_clock") or r.get("transport")
            name = f"perfscope, {'kernel' if clock == 'kernel' else 'user-space'} stamps"
        groups.setdefault((r["server"], r["load"], name), []).append((r, res))
        if "vllm_bench" in r:
            groups.setdefault((r["server"], r["load"], "vllm bench serve (means)"), []).append(
                (r, {"bench": r["vllm_bench"]})
            )
    print(
        "| server | load | client | requests matched of sent (failed) | client stall max | "
        "TTFT − wire p50 | TTFT − wire p99 | E2E − wire p99 | wire send − start stamp p50 | "
        "process CPU | server's CPU share |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def runs(fmt: Any, items: list[tuple[dict[str, Any], dict[str, Any]]]) -> str:
        return " / ".join(fmt(r, res) for r, res in items)

    for (server, load, name), items in groups.items():
        if "bench" in items[0][1]:
            b = items[0][1]["bench"]
            print(
                f"| {server} | {load} | {name} | — | — | mean {_fmt(b['ttft'])} | — | "
                f"mean {_fmt(b['e2e'])} | — | — | — |"
            )
            continue
        matched = sum(int(res["matched"]) for _, res in items)
        sent = sum(int(r["requests"]) for r, _ in items)
        failed = sum(int(res.get("failed") or 0) for _, res in items)
        stall = (
            runs(lambda r, res: _fmt(res.get("stall_worst_s")), items)
            if "stall_worst_s" in items[0][1]
            else "—"
        )
        cells = [
            runs(lambda r, res, k=k, st=st: _fmt(res["errors"][k][st]), items)
            for k, st in (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p99"), ("send", "p50"))
        ]
        cpu = runs(lambda r, res: f"{r.get('process_cpu_s', float('nan')):.1f}", items)
        share = runs(
            lambda r, res: (
                "—" if res.get("server_cpu_share") is None else f"{res['server_cpu_share']:.0%}"
            ),
            items,
        )
        print(
            f"| {server} | {load} | {name} | {matched} of {sent} ({failed}) | {stall} | "
            + " | ".join(cells)
            + f" | {cpu} s | {share} |"
        )
    print("(milliseconds; runs in order, separated by /; positive = the client reports more)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("which", choices=("scripted", "llama", "vllm", "all"))
    ap.add_argument(
        "--transports",
        default="kernel,aiohttp",
        help="stamping modes to measure, comma-separated: kernel (kernel receive stamps), "
        "aiohttp (user-space stamps); default both, interleaved",
    )
    ap.add_argument(
        "--loads",
        default=None,
        help="concurrencies to run, comma-separated (scripted: 16,256; vLLM: 16,48)",
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for captures and results")
    ap.add_argument(
        "--runs",
        type=int,
        default=None,
        help="runs of every client per load, interleaved (llama.cpp 3, scripted and vLLM 1)",
    )
    ap.add_argument("--requests", type=int, default=24, help="llama.cpp: requests per run (24)")
    ap.add_argument("--no-bench", action="store_true", help="skip vllm bench serve")
    ap.add_argument("--aiperf", default=None, metavar="EXE", help="AIPerf's executable (PATH)")
    ap.add_argument("--guidellm", default=None, metavar="EXE", help="guidellm's executable (PATH)")
    ap.add_argument("--no-peers", action="store_true", help="skip AIPerf and guidellm")
    ap.add_argument(
        "--reanalyze",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="recompute perfscope's errors from the captures and runs a results.json names",
    )
    args = ap.parse_args()
    if args.reanalyze is not None:
        rows = json.loads(args.reanalyze.read_text())
        for row in rows:
            if "peer" in row:
                continue  # kept as measured: the peer's own records are not re-read
            port = _pcap_server_port(Path(row["pcap"]))
            wire = wire_requests(Path(row["pcap"]), port)
            failed = row["perfscope"].get("failed")
            row["perfscope"] = compare_perfscope(Path(row["run_dir"]), wire)
            row["perfscope"]["failed"] = failed
            if row.get("bench_pcap"):
                w = wire_means(wire_requests(Path(row["bench_pcap"]), port))
                m = row["bench_means"]
                row["vllm_bench"] = {
                    k: (m[k] - w[k]) if w[k] is not None else None for k in ("ttft", "tpot", "e2e")
                }
        args.reanalyze.write_text(json.dumps(rows, indent=2))
        print_tables(rows)
        print()
        print_compact(rows)
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="wire-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    peers = {} if args.no_peers or args.which == "llama" else find_peers(args)
    if args.which == "scripted":
        proc, port = start_scripted()
        tok = peer_tokenizer(out) if peers else None
        try:
            base = f"http://127.0.0.1:{port}/v1"
            for c in [int(x) for x in (args.loads or "16,256").split(",")]:
                n = max(64, c)
                for _ in range(args.runs or 1):
                    for transport in transports:  # interleaved: the same load on both
                        row = measure(
                            f"{c} streams",
                            port,
                            base,
                            None,
                            ["--concurrency", str(c)],
                            n,
                            out,
                            None,
                            transport,
                        )
                        rows.append({"server": "scripted", **row})
                        (out / "results.json").write_text(json.dumps(rows, indent=2))
                    for peer, exe in peers.items():
                        assert tok is not None
                        row = measure_peer(
                            peer,
                            exe,
                            f"{c} streams",
                            port,
                            f"http://127.0.0.1:{port}",
                            "scripted",
                            tok,
                            c,
                            n,
                            out,
                        )
                        rows.append({"server": "scripted", **row})
                        (out / "results.json").write_text(json.dumps(rows, indent=2))
        finally:
            _stop(proc)
    if args.which in ("llama", "all"):
        proc, port, tok = start_llama(out)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            for c in (1, 4):
                for _ in range(args.runs or 3):
                    row = measure(
                        f"concurrency {c}",
                        port,
                        base,
                        tok,
                        ["--concurrency", str(c)],
                        args.requests,
                        out,
                        None,
                    )
                    rows.append({"server": "llama.cpp", **row})
                    (out / "results.json").write_text(json.dumps(rows, indent=2))
        finally:
            _stop(proc)
    if args.which in ("vllm", "all"):
        proc, port, model, vllm = start_vllm(out)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            # Warm the server's shapes first (compiled graphs per batch size).
            run_perfscope(base, model, ["--concurrency", "16"], 48, out, transports[0])
            loads = (
                ("2 req/s", ["--rate", "2"], 32, ["--request-rate", "2"]),
                ("16 streams", ["--concurrency", "16"], 64, ["--max-concurrency", "16"]),
                ("48 streams", ["--concurrency", "48"], 96, ["--max-concurrency", "48"]),
            )
            for label, load, n, bench_load in loads:
                bench = None if args.no_bench else (vllm, model, bench_load)
                if bench_load[0] == "--max-concurrency":
                    bench_load = [*bench_load, "--request-rate", "inf"]
                    bench = None if args.no_bench else (vllm, model, bench_load)
                if args.loads and label.split()[0] not in args.loads.split(","):
                    continue
                for run in range(args.runs or 1):  # interleaved: every client, then again
                    for k, transport in enumerate(transports):
                        row = measure(
                            label,
                            port,
                            base,
                            model,
                            load,
                            n,
                            out,
                            bench if k == 0 and run == 0 else None,
                            transport,
                        )
                        rows.append({"server": "vLLM CPU", **row})
                        (out / "results.json").write_text(json.dumps(rows, indent=2))
                    if load[0] != "--concurrency":
                        continue  # the peers run closed-loop streams only
                    for peer, exe in peers.items():
                        row = measure_peer(
                            peer,
                            exe,
                            label,
                            port,
                            f"http://127.0.0.1:{port}",
                            "tiny-llama",
                            model,
                            int(load[1]),
                            n,
                            out,
                        )
                        rows.append({"server": "vLLM CPU", **row})
                        (out / "results.json").write_text(json.dumps(rows, indent=2))
        finally:
            _stop(proc)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print_tables(rows)
    print()
    print_compact(rows)
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
