"""Property tests of the two parsers of outside input (hypothesis): the SSE stream parser of
the OpenAI engine and the hardware-database TOML loader.

SSE: a stream of events written the ways real servers write them (any line ending, comments,
keep-alives, ``event:``/``id:`` fields, with or without blank lines after JSON payloads),
cut into reads at arbitrary byte positions, always yields exactly the payloads that were
sent; arbitrary bytes never raise.

hwdb: device files drawn from the schema and then damaged (wrong types, unknown fields and
units, zero, negative and non-finite numbers, invalid TOML) never break the loader; each
file either loads with the values it states, or is reported by an error that names the file
and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfscope.errors import HardwareDatabaseError
from perfscope.hwdb import load_database
from perfscope.hwdb._schema import DeviceFileError
from perfscope.profiler.engines.openai.sse import SSEParser

SETTINGS = settings(max_examples=60, deadline=None)

# ---------------------------------------------------------------------- SSE

_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20
)
json_payload = st.dictionaries(st.sampled_from(["id", "text", "n"]), _text, max_size=3).map(
    lambda d: json.dumps(d, ensure_ascii=False)
)
# Plain text data: not JSON-looking, no leading space (one is stripped after "data:").
plain_line = _text.filter(lambda s: not s.startswith((" ", "{")) and s.strip() != "[DONE]")
plain_payload = st.lists(plain_line.filter(bool), min_size=1, max_size=3).map("\n".join)
payloads = st.lists(st.one_of(json_payload, plain_payload, st.just("[DONE]")), max_size=8)


@st.composite
def streams(draw: Any) -> tuple[bytes, list[str]]:
    """A wire stream and the payloads it carries."""
    events = draw(payloads)
    eol = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    out: list[str] = []
    for payload in events:
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from([": keep-alive", "event: message", "id: 7", ""])))
        is_json = payload == "[DONE]" or payload.startswith("{")
        for line in payload.split("\n"):
            out.append(f"data: {line}" if draw(st.booleans()) else f"data:{line}")
        # Some servers omit the blank line after a complete JSON payload.
        if not is_json or draw(st.booleans()):
            out.append("")
        elif out and out[-1] != "":
            # The next event must not continue this one: a JSON payload ends itself.
            pass
    text = eol.join(out) + (eol if out and draw(st.booleans()) else "")
    return text.encode("utf-8"), events


def _feed_in_pieces(data: bytes, cuts: list[int]) -> list[str]:
    parser = SSEParser()
    got: list[str] = []
    prev = 0
    for c in sorted({min(c, len(data)) for c in cuts}):
        got += parser.feed(data[prev:c])
        prev = c
    got += parser.feed(data[prev:])
    got += parser.close()
    assert parser.events == len(got)
    return got


@given(streams(), st.lists(st.integers(0, 400), max_size=12))
@SETTINGS
def test_sse_yields_every_payload_wherever_the_reads_are_cut(
    stream: tuple[bytes, list[str]], cuts: list[int]
) -> None:
    data, events = stream
    assert _feed_in_pieces(data, cuts) == events


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8))
@SETTINGS
def test_sse_never_raises_on_arbitrary_bytes(data: bytes, cuts: list[int]) -> None:
    whole = _feed_in_pieces(data, [])
    assert all(isinstance(p, str) for p in whole)
    assert _feed_in_pieces(data, cuts) == whole


# ---------------------------------------------------------------------- hwdb TOML


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def to_toml(doc: dict[str, Any]) -> str:
    return "\n".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items()) + "\n"


SRC = "https://example.com/datasheet"
finite_positive = st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def valid_devices(draw: Any) -> dict[str, Any]:
    key = draw(st.from_regex(r"[a-z][a-z0-9-]{2,12}", fullmatch=True))
    bw_unit, bw_factor = draw(st.sampled_from([("GB/s", 1e9), ("TB/s", 1e12), ("GiB/s", 2**30)]))
    fl_unit, fl_factor = draw(st.sampled_from([("TFLOPS", 1e12), ("GFLOPS", 1e9)]))
    return {
        "key": f"prop-{key}",
        "name": f"Property device {key}",
        "vendor": draw(st.sampled_from(["acme", "Acme", "ZETA"])),
        "kind": draw(st.sampled_from(["gpu", "cpu", "npu"])),
        "memory": {"bandwidth": {"value": draw(finite_positive), "unit": bw_unit, "source": SRC}},
        "dense": {"bf16": {"value": draw(finite_positive), "unit": fl_unit, "source": SRC}},
        "_factors": (bw_factor, fl_factor),
    }


junk = st.one_of(
    st.sampled_from([0, -1, -0.5, math.nan, math.inf, -math.inf, 1e308, True, "", " ", "x"]),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
field_paths = [
    ("key",),
    ("name",),
    ("kind",),
    ("vendor",),
    ("aliases",),
    ("schema",),
    ("extends",),
    ("memory",),
    ("memory", "bandwidth"),
    ("memory", "bandwidth", "value"),
    ("memory", "bandwidth", "unit"),
    ("memory", "bandwidth", "source"),
    ("memory", "capacity"),
    ("dense", "bf16", "value"),
    ("dense", "fp7"),
    ("power", "tdp"),
    ("onchip", "sm_count"),
    ("sources",),
    ("nonsense",),
]


@st.composite
def damaged_devices(draw: Any) -> dict[str, Any]:
    doc = draw(valid_devices())
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(field_paths))
        node = doc
        for p in path[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        if draw(st.booleans()) and path[-1] in node:
            del node[path[-1]]
        else:
            node[path[-1]] = draw(junk)
    return doc


def _load_one(tmp: Path, doc: dict[str, Any]) -> tuple[Path, Any]:
    doc = {k: v for k, v in doc.items() if k != "_factors"}
    d = tmp / "devices"
    d.mkdir(exist_ok=True)
    for old in d.iterdir():
        old.unlink()
    path = d / "device.toml"
    path.write_text(to_toml(doc), encoding="utf-8")
    return path, load_database([d])


def _assert_error_names_file_and_field(err: HardwareDatabaseError, path: Path) -> None:
    assert isinstance(err, DeviceFileError), err
    assert err.path == path
    assert str(path) in str(err)
    assert err.problems and all(f and why for f, why in err.problems)
    assert f"field '{err.field}'" in str(err)


hwdb_settings = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@given(valid_devices())
@hwdb_settings
def test_a_valid_device_file_loads_with_its_values_in_si(
    tmp_path: Path, doc: dict[str, Any]
) -> None:
    path, db = _load_one(tmp_path, doc)
    assert [e for e in db.errors if getattr(e, "path", None) == path] == []
    spec = db.devices[doc["key"]]
    bw_factor, fl_factor = doc["_factors"]
    assert spec.mem_bw_bytes_s == pytest.approx(doc["memory"]["bandwidth"]["value"] * bw_factor)
    assert spec.peak_flops["bf16"] == pytest.approx(doc["dense"]["bf16"]["value"] * fl_factor)
    assert spec.vendor == doc["vendor"].lower()


@given(damaged_devices())
@hwdb_settings
def test_a_damaged_device_file_loads_or_names_its_file_and_field(
    tmp_path: Path, doc: dict[str, Any]
) -> None:
    path, db = _load_one(tmp_path, doc)
    mine = [e for e in db.errors if getattr(e, "path", None) == path]
    loaded = [s for s in db.devices.values() if str(path) in db.entries[s.key].files]
    assert len(mine) + bool(loaded) == 1, (mine, loaded)
    for err in mine:
        _assert_error_names_file_and_field(err, path)
    for spec in loaded:
        for value in (spec.mem_bw_bytes_s, *spec.peak_flops.values()):
            assert math.isfinite(value) and value > 0, spec


@given(st.binary(max_size=200))
@hwdb_settings
def test_a_file_that_is_not_toml_is_reported_not_raised(tmp_path: Path, data: bytes) -> None:
    d = tmp_path / "devices"
    d.mkdir(exist_ok=True)
    path = d / "junk.toml"
    path.write_bytes(data)
    db = load_database([d])
    assert "h100-sxm5-80gb" in db.devices  # the bundled database still loads
    mine = [e for e in db.errors if getattr(e, "path", None) == path]
    for err in mine:
        _assert_error_names_file_and_field(err, path)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e308", "0", "-3"])
@pytest.mark.parametrize("field", ["memory.bandwidth", "dense.bf16"])
def test_non_finite_and_non_positive_figures_are_refused(
    tmp_path: Path, value: str, field: str
) -> None:
    section = field.split(".")[0]
    good = {"memory": ("bandwidth", "1000", "GB/s"), "dense": ("bf16", "100", "TFLOPS")}
    lines = ['key = "bad-figure"', 'name = "Bad"', 'vendor = "acme"', 'kind = "gpu"']
    for sec, (n, v, unit) in good.items():
        v = value if sec == section else v
        lines += [f"[{sec}]", f'{n} = {{ value = {v}, unit = "{unit}", source = "{SRC}" }}']
    (tmp_path / "bad.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    db = load_database([tmp_path])
    assert "bad-figure" not in db.devices
    (err,) = [e for e in db.errors if getattr(e, "path", None) == tmp_path / "bad.toml"]
    _assert_error_names_file_and_field(err, tmp_path / "bad.toml")
    assert err.field == field
