"""Streaming transport stamped by the kernel: each byte range carries the time Linux received it.

The aiohttp client (:mod:`.client`) stamps a chunk when the event loop's socket callback
runs. When the loop is stalled (a slow callback, or a server that takes every core), bytes
that arrived earlier take the later read time: 10-1,300 ms late was measured with a vLLM CPU
server on a 2-core machine. This transport asks the kernel instead:

- Each socket has ``SO_TIMESTAMPING`` (``SOF_TIMESTAMPING_RX_SOFTWARE``): every ``recvmsg``
  returns, as ancillary data, the CLOCK_REALTIME at which the kernel queued the last segment
  it returned. It is converted to the run clock (``now_ns``) by how long ago it was.
- TCP merges segments that wait in the receive queue, and a merged segment keeps the later
  stamp. So sockets are read by one **reader thread** (``epoll``; it only reads and stamps,
  never parses) rather than by the event loop: a blocked callback or a busy loop does not
  hold it back (it waits in ``epoll`` without the GIL and gets the GIL back within the
  interpreter's switch interval, 5 ms). A read that returned more than one SSE event is
  counted as *merged*: its earlier events' stamps are upper bounds.
- The request's send stamp is the kernel's transmit stamp of its last byte
  (``SOF_TIMESTAMPING_TX_SOFTWARE``, ``OPT_ID``: read from the socket's error queue) where
  the kernel gives one, else the time ``send`` returned.
- HTTP/1.1 is parsed by ``h11`` (sans-IO), chunked transfer included; SSE framing is
  :class:`.sse.SSEParser`'s, the event semantics :func:`.client._apply_event`'s, so both
  transports produce the same :class:`.client.StreamResult`.

Per read the transport also keeps two delays (ns): the reader thread's (kernel stamp to
``recvmsg``; how close the stamps are to exact) and the event loop's (kernel stamp to the
coroutine that processed it: what a user-space client would have booked as latency). The
second is the client's *stall*.

Plain ``http://`` on Linux only; :func:`kernel_stamps_available` says whether the kernel
accepts the options. Elsewhere (TLS, other systems) the engine keeps the aiohttp client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import select
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

from perfscope.profiler.engines.openai.client import (
    ReadLimits,
    StreamResult,
    _apply_event,
    error_text,
)
from perfscope.profiler.engines.openai.sse import SSEParser

__all__ = [
    "KernelTransport",
    "ReadStamp",
    "kernel_stamps_available",
]

#: Linux socket option numbers (``asm-generic/socket.h``; Python's socket module lacks them).
SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
_RX_FLAGS = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
_TX_FLAGS = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY
#: ``struct scm_timestamping``: three ``struct timespec`` (software stamp first).
_TS_SPACE = socket.CMSG_SPACE(48) + socket.CMSG_SPACE(64) if hasattr(socket, "CMSG_SPACE") else 0
_IP_RECVERR = 11
_IPV6_RECVERR = 25
_READ_SIZE = 65536


def kernel_stamps_available() -> bool:
    """Whether this system stamps received TCP data for a socket (Linux with
    ``SO_TIMESTAMPING`` accepted); False elsewhere."""
    if not sys.platform.startswith("linux") or not hasattr(socket.socket, "recvmsg"):
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS)
    except OSError:
        return False
    return True


def _timespec_ns(data: bytes) -> int:
    sec, nsec = struct.unpack_from("qq", data)
    return int(sec * 1_000_000_000 + nsec)


@dataclass(frozen=True)
class ReadStamp:
    """One ``recvmsg`` of a stream.

    Attributes:
        data: the bytes read (empty: the peer closed).
        kernel_ns: when the kernel received the last segment of ``data`` (run clock, ns);
            None when the read carried no stamp.
        read_ns: when the reader thread's ``recvmsg`` returned (run clock, ns).
        per_segment: ``data`` is one TCP segment's bytes (or part) and ``kernel_ns`` that
            segment's stamp, from the packet tap.
    """

    data: bytes
    kernel_ns: int | None
    read_ns: int
    per_segment: bool = False


@dataclass
class _Conn:
    """One TCP connection, its HTTP state and what the reader thread has read for it."""

    sock: socket.socket
    key: tuple[str, int]
    http: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    inbox: deque[ReadStamp] = field(default_factory=deque)
    tx_stamps: dict[int, int] = field(default_factory=dict)
    bytes_sent: int = 0
    wake: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    eof: bool = False
    requests: int = 0
    #: Packet tap only: the server's initial sequence number and the received segments
    #: not yet read, as (offset in the received stream, length, run-clock ns).
    isn: int | None = None
    segments: deque[tuple[int, int, int]] = field(default_factory=deque)
    rx_offset: int = 0

    def notify(self) -> None:
        """Wake the coroutine reading this connection (reader thread → event loop)."""
        ev, loop = self.wake, self.loop
        if ev is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(ev.set)


ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
PACKET_OUTGOING = 4
_TAP_SNAP = 134  # Ethernet (14) + IPv4 (up to 60) + TCP (up to 60) headers


class _PacketTap:
    """Per-segment receive stamps from an ``AF_PACKET`` socket (needs CAP_NET_RAW).

    TCP merges segments that wait in a socket's receive queue and keeps the later stamp, so
    a reader that was descheduled (a server taking every core) would stamp every waiting
    event with the last one's time. A packet socket queues every packet on its own with its
    own kernel stamp; mapping each received TCP sequence range to the stream's byte offsets
    gives each SSE event the receive time of the segment that completed it, however late the
    stream is read. Only the headers of each packet are copied (``_TAP_SNAP`` bytes).
    """

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.by_port: dict[int, _Conn] = {}
        self.dropped = 0
        self.filter_port: int | None = None
        self._filter_buf: Any = None

    def filter_server_port(self, port: int) -> None:
        """Let the kernel pass only IPv4 TCP segments from ``port`` (a classic BPF program,
        as ``tcpdump 'tcp src port P'``): less work, and no bytes of other connections are
        copied. A second server port lifts the filter (every packet, filtered here)."""
        if self.filter_port == port:
            return
        if self.filter_port is not None:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            self.filter_port = -1
            return
        prog = [
            (0x28, 0, 0, 12),  # ldh [12]: EtherType
            (0x15, 0, 8, 0x0800),  # IPv4, else drop
            (0x30, 0, 0, 23),  # ldb [23]: IP protocol
            (0x15, 0, 6, 6),  # TCP, else drop
            (0x28, 0, 0, 20),  # ldh [20]: fragment offset
            (0x45, 4, 0, 0x1FFF),  # a fragment: drop
            (0xB1, 0, 0, 14),  # ldxb 4*([14]&0xf): IP header length
            (0x48, 0, 0, 14),  # ldh [x+14]: TCP source port
            (0x15, 0, 1, port),  # the server's, else drop
            (0x06, 0, 0, _TAP_SNAP),  # keep the headers
            (0x06, 0, 0, 0),  # drop
        ]
        raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
        buf = ctypes.create_string_buffer(raw)
        fprog = struct.pack("HL", len(prog), ctypes.addressof(buf))
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        except OSError:
            return
        self._filter_buf = buf  # the kernel copied it; kept for clarity of lifetime
        self.filter_port = port

    @classmethod
    def open(cls) -> _PacketTap | None:
        """A tap, or None where packet sockets are not permitted (no CAP_NET_RAW)."""
        if not hasattr(socket, "AF_PACKET"):
            return None
        try:
            return cls()
        except OSError:
            return None

    def drain(self, to_run_clock: Callable[[int], int]) -> None:
        """Read every queued packet; file the TCP segments of registered connections."""
        sock = self.sock
        while True:
            try:
                pkt, anc, _f, addr = sock.recvmsg(_TAP_SNAP, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if addr[2] == PACKET_OUTGOING or len(pkt) < 54 or pkt[12:14] != b"\x08\x00":
                continue
            ip = 14
            ihl = (pkt[ip] & 0x0F) * 4
            if pkt[ip + 9] != 6:  # not TCP
                continue
            total = int.from_bytes(pkt[ip + 2 : ip + 4], "big")
            tcp = ip + ihl
            sport = int.from_bytes(pkt[tcp : tcp + 2], "big")
            dport = int.from_bytes(pkt[tcp + 2 : tcp + 4], "big")
            conn = self.by_port.get(dport)
            if conn is None or conn.key[1] != sport:
                continue
            seq = int.from_bytes(pkt[tcp + 4 : tcp + 8], "big")
            thl = (pkt[tcp + 12] >> 4) * 4
            flags = pkt[tcp + 13]
            stamp: int | None = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                    stamp = to_run_clock(_timespec_ns(payload))
            if flags & 0x12 == 0x12:  # SYN-ACK: the server's initial sequence number
                conn.isn = seq
                continue
            n = total - ihl - thl
            if n <= 0 or stamp is None:
                continue
            if conn.isn is None:
                conn.isn = (seq - 1 - conn.rx_offset) & 0xFFFFFFFF
            off = (seq - conn.isn - 1) & 0xFFFFFFFF
            if off + n <= conn.rx_offset or (conn.segments and off < conn.segments[-1][0]):
                continue  # a retransmission of bytes already filed
            conn.segments.append((off, n, stamp))

    def split(
        self, conn: _Conn, data: bytes, fallback: int | None
    ) -> list[tuple[bytes, int | None]]:
        """``data`` (read at ``conn.rx_offset``) cut at segment boundaries, each piece with
        its segment's stamp (``fallback``, the socket's stamp, where the tap has none)."""
        start = conn.rx_offset
        end = start + len(data)
        conn.rx_offset = end
        segs = conn.segments
        out: list[tuple[bytes, int | None]] = []
        pos = start
        while pos < end:
            while segs and segs[0][0] + segs[0][1] <= pos:
                segs.popleft()
            if not segs or segs[0][0] > pos:
                nxt = segs[0][0] if segs else end
                stop = min(end, nxt)
                self.dropped += 1
                out.append((data[pos - start : stop - start], fallback))
                pos = stop
                continue
            off, n, stamp = segs[0]
            stop = min(end, off + n)
            out.append((data[pos - start : stop - start], stamp))
            pos = stop
        return out

    def close(self) -> None:
        """Close the packet socket."""
        with contextlib.suppress(OSError):
            self.sock.close()


class _Reader(threading.Thread):
    """The thread that reads every registered socket and stamps what it reads."""

    def __init__(self, now_ns: Callable[[], int]) -> None:
        super().__init__(name="perfscope-kstamp-reader", daemon=True)
        self.now_ns = now_ns
        self.ep = select.epoll()
        self.conns: dict[int, _Conn] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.tap = _PacketTap.open()
        if self.tap is not None:
            self.ep.register(self.tap.sock.fileno(), select.EPOLLIN)

    def register_port(self, conn: _Conn, port: int) -> None:
        """File the tap's packets to local ``port`` under ``conn`` (before connecting)."""
        if self.tap is not None:
            self.tap.by_port[port] = conn

    def register(self, conn: _Conn) -> None:
        with self.lock:
            self.conns[conn.sock.fileno()] = conn
        self.ep.register(conn.sock.fileno(), select.EPOLLIN | select.EPOLLRDHUP)

    def unregister(self, conn: _Conn) -> None:
        if self.tap is not None:
            with contextlib.suppress(OSError):
                port = conn.sock.getsockname()[1]
                if self.tap.by_port.get(port) is conn:
                    del self.tap.by_port[port]
        fd = conn.sock.fileno()
        with self.lock:
            self.conns.pop(fd, None)
        if fd >= 0:
            with contextlib.suppress(OSError, ValueError):
                self.ep.unregister(fd)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                events = self.ep.poll(0.05)
            except (OSError, ValueError):  # closed
                return
            touched: list[_Conn] = []
            if self.tap is not None:  # first: the packets of the bytes about to be read
                self.tap.drain(self._to_run_clock)
            for fd, ev in events:
                with self.lock:
                    conn = self.conns.get(fd)
                if conn is None:
                    continue
                if ev & select.EPOLLERR:
                    self._read_errqueue(conn)
                if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLRDHUP):
                    self._read(conn)
                    touched.append(conn)
            for conn in touched:
                conn.notify()

    def _to_run_clock(self, real_ns: int) -> int:
        # How long ago the kernel stamped it, taken off the run clock now. The two clocks are
        # read one after the other, so a preemption between the reads would move the stamp by
        # its length (12 ms was seen on a loaded machine): bracket the run clock by two
        # realtime reads and keep the tightest of a few tries.
        best: tuple[int, int] | None = None
        for _ in range(3):
            r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            now = self.now_ns()
            r2 = time.clock_gettime_ns(time.CLOCK_REALTIME)
            if best is None or r2 - r1 < best[0]:
                best = (r2 - r1, now - ((r1 + r2) // 2 - real_ns))
            if r2 - r1 < 20_000:  # 20 us: good enough
                break
        assert best is not None
        return best[1]

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        while not conn.eof:
            try:
                data, anc, _flags, _addr = sock.recvmsg(_READ_SIZE, _TS_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # reset: a note for the coroutine (read_ns -1)
                conn.eof = True
                conn.inbox.append(ReadStamp((exc.strerror or repr(exc)).encode(), None, -1))
                self.unregister(conn)
                return
            t_read = self.now_ns()
            k_ns: int | None = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPING and len(payload) >= 16:
                    real = _timespec_ns(payload)
                    if real:
                        k_ns = self._to_run_clock(real)
            if data and self.tap is not None:
                self.tap.drain(self._to_run_clock)
                for piece, stamp in self.tap.split(conn, data, k_ns):
                    conn.inbox.append(ReadStamp(piece, stamp, t_read, per_segment=True))
            else:
                conn.inbox.append(ReadStamp(data, k_ns, t_read))
            if not data:
                conn.eof = True
                self.unregister(conn)
                return

    def _read_errqueue(self, conn: _Conn) -> None:
        """Transmit stamps: ``(byte offset of the last byte sent, kernel time)``."""
        while True:
            try:
                _d, anc, _f, _a = conn.sock.recvmsg(1, _TS_SPACE, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            stamp: int | None = None
            key: int | None = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPING and len(payload) >= 16:
                    real = _timespec_ns(payload)
                    stamp = self._to_run_clock(real) if real else None
                elif (level, kind) in (
                    (socket.IPPROTO_IP, _IP_RECVERR),
                    (socket.IPPROTO_IPV6, _IPV6_RECVERR),
                ) and len(payload) >= 16:
                    key = struct.unpack_from("I", payload, 12)[0]  # sock_extended_err.ee_data
            if stamp is not None and key is not None:
                conn.tx_stamps[key] = stamp


class _ClosedEarlyError(Exception):
    """The connection ended before a full response."""


@dataclass
class TransportStats:
    """What the transport measured over a run (ns lists are per read).

    Attributes:
        reader_delay_ns: kernel stamp to the reader thread's ``recvmsg`` (how exact stamps
            are: segments that wait merge and keep the later stamp).
        loop_delay_ns: kernel stamp to the event loop's processing of the read (the stall a
            user-space stamp would have carried).
        reads / stamped_reads / merged_reads: reads of response bytes; those with a kernel
            stamp; those that held more than one SSE event with choices.
        kernel_send_stamps / user_send_stamps: requests whose send stamp is the kernel's
            transmit stamp / the time ``send`` returned.
        per_segment_reads: reads stamped per TCP segment by the packet tap; tap_gaps: byte
            ranges the tap had no segment for (its queue overflowed): the socket's stamp.
    """

    reader_delay_ns: list[int] = field(default_factory=list)
    loop_delay_ns: list[int] = field(default_factory=list)
    reads: int = 0
    stamped_reads: int = 0
    merged_reads: int = 0
    kernel_send_stamps: int = 0
    user_send_stamps: int = 0
    per_segment_reads: int = 0
    tap_gaps: int = 0

    def clear(self) -> None:
        """Start a new run."""
        self.__init__()  # type: ignore[misc]

    def merge(self, other: TransportStats) -> None:
        """Add ``other``'s reads and stamps to this one's."""
        self.reader_delay_ns += other.reader_delay_ns
        self.loop_delay_ns += other.loop_delay_ns
        self.reads += other.reads
        self.stamped_reads += other.stamped_reads
        self.merged_reads += other.merged_reads
        self.kernel_send_stamps += other.kernel_send_stamps
        self.user_send_stamps += other.user_send_stamps
        self.per_segment_reads += other.per_segment_reads
        self.tap_gaps += other.tap_gaps


class KernelTransport:
    """Kernel-stamped HTTP/1.1 streaming over a pool of keep-alive connections.

    Create it inside the event loop that will use it; ``close()`` at the end.
    ``reuse=False`` opens a new connection per request (``--connection new``).
    """

    _MAX_DELAYS = 2_000_000

    def __init__(self, now_ns: Callable[[], int], *, reuse: bool = True) -> None:
        self.now_ns = now_ns
        self.reuse = reuse
        self.reader = _Reader(now_ns)
        self.reader.start()
        self.idle: dict[tuple[str, int], list[_Conn]] = {}
        self.stats = TransportStats()

    def close(self) -> None:
        """Close every connection and stop the reader thread."""
        for conns in self.idle.values():
            for c in conns:
                self._drop(c)
        self.idle.clear()
        self.reader.stop.set()
        self.reader.join(2)
        if self.reader.tap is not None:
            self.stats.tap_gaps = self.reader.tap.dropped
            self.reader.tap.close()
        with contextlib.suppress(OSError):
            self.reader.ep.close()

    def _drop(self, conn: _Conn) -> None:
        self.reader.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()

    async def _open(self, host: str, port: int) -> tuple[_Conn, int]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _t, _p, _c, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS)
        conn = _Conn(sock, (host, port))
        if self.reader.tap is not None:  # the local port first: the tap files the SYN-ACK
            self.reader.tap.filter_server_port(port)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            self.reader.register_port(conn, sock.getsockname()[1])
        t0 = self.now_ns()
        try:
            await loop.sock_connect(sock, addr)
        except BaseException:
            self.reader.unregister(conn)
            sock.close()
            raise
        # Transmit stamps keyed by byte offset (OPT_ID) need a connected TCP socket.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _RX_FLAGS | _TX_FLAGS)
        self.reader.register(conn)
        return conn, self.now_ns() - t0

    async def stream_request(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        timeout_s: float | None,
        limits: ReadLimits | None = None,
    ) -> StreamResult:
        """POST ``body`` to ``url`` and read the SSE stream to its end, stamped by the
        kernel; never raises for a failed request (the failure is in ``error``). Same
        contract as :func:`.client.stream_request`."""
        res = StreamResult()
        lim = limits if limits is not None else ReadLimits()
        parser = SSEParser(lim.max_line_bytes)
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        t_begin = self.now_ns()
        conn: _Conn | None = None
        t_sent: int | None = None
        key: int | None = None
        try:
            async with asyncio.timeout(timeout_s):
                pool = self.idle.get((host, port)) or []
                while pool and conn is None:
                    c = pool.pop()
                    if c.eof or c.inbox:
                        self._drop(c)
                    else:
                        conn, res.reused = c, True
                if conn is None:
                    conn, res.connect_ns = await self._open(host, port)
                conn.loop = asyncio.get_running_loop()
                conn.wake = asyncio.Event()
                conn.requests += 1
                hdrs = [("Host", f"{host}:{port}"), ("Content-Length", str(len(body)))]
                hdrs += [(k, v) for k, v in headers.items() if k.lower() != "host"]
                if not self.reuse:
                    hdrs.append(("Connection", "close"))
                wire = conn.http.send(h11.Request(method="POST", target=target, headers=hdrs))
                wire = (wire or b"") + (conn.http.send(h11.Data(data=body)) or b"")
                wire += conn.http.send(h11.EndOfMessage()) or b""
                await conn.loop.sock_sendall(conn.sock, wire)
                t_sent = self.now_ns()
                conn.bytes_sent += len(wire)
                key = conn.bytes_sent - 1
                await self._read_response(conn, res, parser, lim)
        except _ClosedEarlyError as exc:
            res.error = str(exc) or "connection closed by the server"
            res.retryable = res.t_headers_ns is None and (t_sent is None or res.reused)
        except ValueError as exc:
            res.error = str(exc)[:200]
        except h11.RemoteProtocolError as exc:
            if conn is not None and conn.eof and res.t_headers_ns is None:
                # Closed before any response: a pooled connection the server had closed.
                res.error = "connection closed by the server"
                res.retryable = t_sent is None or res.reused
            elif res.t_headers_ns is not None and "chunk" in str(exc).lower():
                res.error = (f"transport error: the server's chunked encoding is broken ({exc})")[
                    :200
                ]
            elif conn is not None and conn.eof:
                res.error = "connection reset during the stream"
            elif res.t_headers_ns is not None:
                res.error = (
                    f"transport error: the server's chunked encoding or framing is broken ({exc})"
                )[:200]
            else:
                res.error = f"malformed HTTP response: {exc}"[:200]
        except h11.LocalProtocolError as exc:
            res.error = f"cannot send the request: {exc}"[:200]
        except TimeoutError:
            res.error = f"timeout after {timeout_s:g} s" if timeout_s else "timeout"
        except ConnectionRefusedError as exc:
            res.error = f"cannot connect: {exc.strerror or exc}"[:200]
            res.retryable = True
        except OSError as exc:
            res.error = (
                "connection reset during the stream"
                if res.t_headers_ns is not None
                else f"connection reset: {exc.strerror or exc}"[:200]
            )
            res.retryable = res.t_headers_ns is None and (t_sent is None or res.reused)
        finally:
            if conn is not None:
                conn.wake = None
                self._release(conn)
        res.t_sent_ns = self._send_stamp(conn, key, t_sent, t_begin)
        res.kernel_stamped = res.stall_ns is not None
        res.settle()
        res.events, res.comments, res.ignored_lines = (
            parser.events,
            parser.comments,
            parser.ignored_lines,
        )
        if res.error is None and not res.done and not res.finish_reasons:
            res.error = (
                f"truncated stream: ended after {len(res.t_ns)} chunks without a finish_reason "
                "or [DONE]"
            )
        return res

    def _send_stamp(
        self, conn: _Conn | None, key: int | None, t_sent: int | None, t_begin: int
    ) -> int:
        """The kernel's transmit stamp of the request's last byte, else the write's return."""
        if conn is not None and key is not None:
            k = conn.tx_stamps.pop(key, None)
            conn.tx_stamps.clear()
            if k is not None and t_sent is not None and k <= t_sent + 1_000_000:
                self.stats.kernel_send_stamps += 1
                return k
        self.stats.user_send_stamps += 1
        return t_sent if t_sent is not None else t_begin

    def _release(self, conn: _Conn) -> None:
        http = conn.http
        if (
            self.reuse
            and not conn.eof
            and http.our_state is h11.DONE
            and http.their_state is h11.DONE
        ):
            http.start_next_cycle()
            self.idle.setdefault(conn.key, []).append(conn)
        else:
            self._drop(conn)

    async def _next_reads(self, conn: _Conn) -> list[ReadStamp]:
        wake = conn.wake
        assert wake is not None
        while not conn.inbox:
            wake.clear()
            if conn.inbox:
                break
            await wake.wait()
        out = list(conn.inbox)
        for _ in out:
            conn.inbox.popleft()
        return out

    async def _read_response(
        self, conn: _Conn, res: StreamResult, parser: SSEParser, lim: ReadLimits
    ) -> None:
        """Read one response into ``res``. Redirects are refused (the kernel path never
        follows one: the engine picks the aiohttp client for ``follow_redirects``), and error
        or non-streamed bodies are read to ``lim.max_body_bytes``; either way the connection
        is then dropped, not reused."""
        http = conn.http
        st = self.stats
        error_body: list[bytes] | None = None
        error_len = 0
        reason = ""
        while True:
            for rs in await self._next_reads(conn):
                if rs.read_ns < 0:  # the reader's note of a reset
                    raise OSError(rs.data.decode(errors="replace"))
                t_loop = self.now_ns()
                stamp = rs.kernel_ns if rs.kernel_ns is not None else rs.read_ns
                if rs.data:
                    st.reads += 1
                    st.per_segment_reads += rs.per_segment
                    if rs.kernel_ns is not None:
                        st.stamped_reads += 1
                        stall = t_loop - rs.kernel_ns
                        res.stall_ns = max(res.stall_ns or 0, stall)
                        if len(st.loop_delay_ns) < self._MAX_DELAYS:
                            st.reader_delay_ns.append(rs.read_ns - rs.kernel_ns)
                            st.loop_delay_ns.append(stall)
                http.receive_data(rs.data)
                before = len(res.candidates)
                while True:
                    ev = http.next_event()
                    if ev is h11.NEED_DATA or ev is h11.PAUSED:
                        break
                    if isinstance(ev, h11.Response):
                        res.status = ev.status_code
                        res.t_headers_ns = stamp
                        reason = ev.reason.decode(errors="replace")
                        location = dict(ev.headers).get(b"location")
                        if 300 <= ev.status_code < 400 and location:
                            where = location.decode(errors="replace")[:200]
                            res.error = (
                                f"HTTP {ev.status_code} redirect to {where!r} refused: the "
                                "timings would be of another server; use that URL, or "
                                "--engine-opt follow_redirects=1"
                            )
                            return
                        if ev.status_code != 200:
                            error_body = []
                        else:
                            ctype = dict(ev.headers).get(b"content-type", b"").decode()
                            if "text/event-stream" not in ctype and "application/json" in ctype:
                                error_body = []
                                res.error = (
                                    f"server did not stream (Content-Type "
                                    f"{ctype.split(';')[0]}): it ignored stream=true"
                                )
                    elif isinstance(ev, h11.Data):
                        if error_body is not None:
                            error_body.append(bytes(ev.data))
                            error_len += len(ev.data)
                            if error_len > lim.max_body_bytes:
                                raw = b"".join(error_body)[: lim.max_body_bytes]
                                if res.error is None:
                                    text = raw.decode(errors="replace")
                                    res.error = error_text(res.status, reason, text) + (
                                        f" (body cut at {lim.max_body_bytes:,} bytes)"
                                    )
                                return
                        else:
                            for payload in parser.feed(bytes(ev.data)):
                                _apply_event(res, payload, stamp)
                    elif isinstance(ev, h11.EndOfMessage):
                        if error_body is not None and res.error is None:
                            text = b"".join(error_body).decode(errors="replace")
                            res.error = error_text(res.status, reason, text)
                        elif error_body is None and not res.done:
                            for payload in parser.close():
                                _apply_event(res, payload, stamp)
                        st.merged_reads += len(res.candidates) - before > 1
                        return
                    elif isinstance(ev, h11.ConnectionClosed):
                        if res.t_headers_ns is None:
                            raise _ClosedEarlyError("connection closed by the server")
                        if not res.done and error_body is None:
                            for payload in parser.close():
                                _apply_event(res, payload, stamp)
                        if res.error is None and not res.done and not res.finish_reasons:
                            raise _ClosedEarlyError("connection reset during the stream")
                        st.merged_reads += len(res.candidates) - before > 1
                        return
                if len(res.candidates) - before > 1:
                    st.merged_reads += 1
