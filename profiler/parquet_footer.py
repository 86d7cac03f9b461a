"""The schema part of a Parquet file's footer, read without pyarrow (tens of microseconds).

A Parquet file ends with its footer (a Thrift compact-protocol ``FileMetaData``), the
footer's length (4 bytes, little-endian) and ``PAR1``. Which columns a file has, and the
Arrow types pyarrow reads them as, depend only on two parts of that footer: the list of
schema elements (field 2) and the key/value metadata (field 5, where pyarrow keeps the Arrow
schema under ``ARROW:schema``). Row counts, row groups and statistics (the parts that differ
between two runs' files of the same schema) are skipped.

:func:`schema_key` returns those two parts as bytes, so a reader that checks table schemas
(the run index over thousands of runs) can open the footer with pyarrow once per distinct
schema and reuse the verdict for every file with the same key. Any footer this parser does
not understand gives ``None``, and the caller reads that file with pyarrow as before.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["MAX_FOOTER_BYTES", "SchemaKeys", "parse_schema_key", "schema_key"]

#: Footers larger than this (bytes) are not parsed here (the caller uses pyarrow).
MAX_FOOTER_BYTES = 1 << 20

_MAGIC = b"PAR1"


class _MalformedError(Exception):
    """The bytes are not a Thrift compact struct this parser follows."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    out = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise _MalformedError
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7


def _skip(buf: bytes, pos: int, ttype: int) -> int:
    """The position after one scalar value of compact type ``ttype`` starting at ``pos``."""
    if ttype in (1, 2):  # bool (in a struct field the value is in the type nibble)
        return pos
    if ttype == 3:  # byte
        return pos + 1
    if ttype in (4, 5, 6):  # i16, i32, i64: zigzag varints
        return _varint(buf, pos)[1]
    if ttype == 7:  # double
        return pos + 8
    if ttype == 8:  # binary
        n, pos = _varint(buf, pos)
        return pos + n
    raise _MalformedError


def _list_header(buf: bytes, pos: int) -> tuple[int, int, int]:
    if pos >= len(buf):
        raise _MalformedError
    head = buf[pos]
    pos += 1
    n = head >> 4
    if n == 15:
        n, pos = _varint(buf, pos)
    return n, head & 0x0F, pos


def _field(buf: bytes, pos: int, last: int) -> tuple[int, int, int]:
    """The next field header of a struct: ``(type, field id, position after it)``; type 0
    is the struct's end. ``last`` is the previous field's id (ids are delta-encoded)."""
    if pos >= len(buf):
        raise _MalformedError
    head = buf[pos]
    pos += 1
    if head == 0:
        return 0, last, pos
    delta, ft = head >> 4, head & 0x0F
    if delta:
        return ft, last + delta, pos
    z, pos = _varint(buf, pos)
    return ft, (z >> 1) ^ -(z & 1), pos


def _walk_struct(buf: bytes, pos: int, depth: int = 0) -> int:
    """The position after the struct (or the rest of one) starting at ``pos``, its fields
    skipped."""
    last = 0
    while True:
        ft, last, pos = _field(buf, pos, last)
        if ft == 0:
            return pos
        pos = _skip_value(buf, pos, ft, depth + 1)


def _skip_value(buf: bytes, pos: int, ttype: int, depth: int) -> int:
    if ttype == 12:
        if depth > 32:
            raise _MalformedError
        return _walk_struct(buf, pos, depth)
    if ttype == 11:  # map
        n, pos = _varint(buf, pos)
        if n == 0:
            return pos
        if pos >= len(buf):
            raise _MalformedError
        kt, vt = buf[pos] >> 4, buf[pos] & 0x0F
        pos += 1
        for _ in range(n):
            pos = _skip_value(buf, pos, kt, depth + 1)
            pos = _skip_value(buf, pos, vt, depth + 1)
        return pos
    if ttype in (9, 10):
        n, etype, pos = _list_header(buf, pos)
        for _ in range(n):
            pos = pos + 1 if etype in (1, 2) else _skip_value(buf, pos, etype, depth + 1)
        return pos
    return _skip(buf, pos, ttype)


def _key_values(buf: bytes, pos: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """The ``KeyValue`` list at ``pos`` and the position after it."""
    n, etype, pos = _list_header(buf, pos)
    if etype != 12:
        raise _MalformedError
    out: list[tuple[bytes, bytes]] = []
    for _ in range(n):
        key = value = b""
        last = 0
        while True:
            ft, last, pos = _field(buf, pos, last)
            if ft == 0:
                break
            if ft == 8 and last in (1, 2):
                size, pos = _varint(buf, pos)
                if pos + size > len(buf):
                    raise _MalformedError
                if last == 1:
                    key = buf[pos : pos + size]
                else:
                    value = buf[pos : pos + size]
                pos += size
            else:
                pos = _skip_value(buf, pos, ft, 1)
        out.append((key, value))
    return out, pos


def _schema_elements(footer: bytes) -> bytes | None:
    """Field 2 of ``FileMetaData`` (the schema elements) as stored, or ``None``: the
    footer starts with field 1 (``version``, an i32) and then field 2, both required."""
    if len(footer) < 3 or footer[0] != 0x15:  # field 1, i32
        return None
    _v, pos = _varint(footer, 1)
    if pos >= len(footer) or footer[pos] != 0x19:  # field 2 (delta 1), list
        return None
    start = pos + 1
    return footer[start : _skip_value(footer, start, 9, 0)]


def _key_value_tail(footer: bytes, after: int) -> tuple[list[tuple[bytes, bytes]], int] | None:
    """The key/value metadata (field 5), found without walking the row groups (field 4,
    most of the footer, slow in Python): the list must start just before the last
    ``ARROW:schema`` key and the footer must parse from there to its last byte."""
    mark = footer.rfind(b"ARROW:schema")
    if mark < after:
        return None
    for p in range(mark - 1, max(after, mark - 24) - 1, -1):
        if footer[p] != 0x19:  # field 5 after field 4 (delta 1), list
            continue
        try:
            kv, pos = _key_values(footer, p + 1)
            if _walk_struct(footer, pos) != len(footer):
                continue
        except _MalformedError:
            continue
        if any(k == b"ARROW:schema" for k, _ in kv):
            return kv, p
    return None


class SchemaKeys:
    """:func:`schema_key` with memory: the schema elements and key/value tails already
    parsed are matched as bytes (a prefix and a suffix of the footer) before any parsing,
    so files that share a schema cost one read of their footer each. The parse of a byte
    range depends only on those bytes, so a matched range reads as it did the first time."""

    def __init__(self) -> None:
        self._heads: list[tuple[bytes, bytes]] = []  # (footer prefix, schema elements)
        self._tails: list[tuple[bytes, list[tuple[bytes, bytes]]]] = []  # (suffix, kv)

    def parse(self, footer: bytes) -> bytes | None:
        """The schema key of a ``FileMetaData`` (Thrift compact bytes), or ``None``."""
        schema = next((sch for head, sch in self._heads if footer.startswith(head)), None)
        kv = next((kv for tail, kv in self._tails if footer.endswith(tail)), None)
        try:
            if schema is None:
                schema = _schema_elements(footer)
                if schema is None:
                    return None
                if len(self._heads) < 64:
                    self._heads.append((footer[: footer.index(schema) + len(schema)], schema))
            if kv is None:
                found = _key_value_tail(footer, 1 + len(schema))
                if found is None:
                    return None
                kv, start = found
                if len(self._tails) < 64:
                    self._tails.append((footer[start:], kv))
        except _MalformedError:
            return None
        parts = [len(schema).to_bytes(8, "little"), schema]
        for k, v in sorted(kv):
            parts += [len(k).to_bytes(8, "little"), k, len(v).to_bytes(8, "little"), v]
        return b"".join(parts)

    def key(self, path: str | os.PathLike[str]) -> bytes | None:
        """The schema key of the Parquet file at ``path`` (see the module docstring), or
        ``None`` when it cannot be read or parsed here (the caller then asks pyarrow)."""
        footer = _read_footer(path)
        return None if footer is None else self.parse(footer)

    def file_key(self, path: str | os.PathLike[str]) -> tuple[bool, bytes | None]:
        """Whether ``path`` is a regular file (``Path.is_file``), and its :meth:`key`:
        one open answers both (a run's tables are looked for and read in one go)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
        except FileNotFoundError:  # the common miss (a run without telemetry): no stat
            return False, None
        except OSError:
            return _is_regular(path), None  # there and unreadable, or not a file at all
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return False, None
            footer = _footer_at(fd, st.st_size)
        except OSError:
            footer = None
        finally:
            os.close(fd)
        return True, None if footer is None else self.parse(footer)


def parse_schema_key(footer: bytes) -> bytes | None:
    """The schema key of a ``FileMetaData`` (Thrift compact bytes), or ``None``."""
    return SchemaKeys().parse(footer)


def schema_key(path: str | os.PathLike[str]) -> bytes | None:
    """The schema key of the Parquet file at ``path`` (see the module docstring), or
    ``None`` when it cannot be read or parsed here (the caller then asks pyarrow)."""
    return SchemaKeys().key(path)


#: Bytes read from a file's end in one call: the footer of a run's table (a few KiB) and its
#: length come back together, with no second read.
_TAIL_BYTES = 16 * 1024


def _read_footer(path: str | os.PathLike[str]) -> bytes | None:
    """The footer bytes of the Parquet file at ``path``, or ``None`` when it has none.

    One ``pread`` of the file's last :data:`_TAIL_BYTES` usually holds the footer, its
    length and the closing magic; a longer footer costs one more read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _footer_at(fd, os.fstat(fd).st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _footer_at(fd: int, size: int) -> bytes | None:
    """:func:`_read_footer` of the open file ``fd`` of ``size`` bytes (``OSError`` passes)."""
    if size < 12:
        return None
    want = min(size, _TAIL_BYTES)
    tail = os.pread(fd, want, size - want)
    if len(tail) != want or tail[-4:] != _MAGIC:
        return None
    n = int.from_bytes(tail[-8:-4], "little")
    if n <= 0 or n > MAX_FOOTER_BYTES or n + 12 > size:
        return None
    head = tail[:4] if want == size else os.pread(fd, 4, 0)
    if head != _MAGIC:
        return None
    if n + 8 <= want:
        return tail[want - 8 - n : want - 8]
    footer = os.pread(fd, n, size - 8 - n)
    return footer if len(footer) == n else None


def _is_regular(path: str | os.PathLike[str]) -> bool:
    """``Path(path).is_file()``: False when absent or not a regular file; an error other
    than absence (a folder that cannot be searched) passes, as it does there."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise
    except ValueError:
        return False
