"""The typed summary: /1 and /2 JSON load, round-trip, tolerate unknown keys, say why a
section is absent; the catalogue names, reads and formats its metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from perfscope.analysis import Summary
from perfscope.analysis.catalogue import (
    METRICS,
    format_bytes,
    format_count,
    format_ratio,
    format_seconds,
    format_value,
    metric,
    parse_duration,
    parse_quantity,
    value_at,
)
from perfscope.analysis.summary import SUMMARY_SCHEMA, Distribution, PhaseRoofline
from perfscope.errors import UsageError
from tests.conftest import DATA

V1 = json.loads((DATA / "runs" / "v1" / "summary.json").read_text())


def test_a_v1_summary_loads_into_typed_sections() -> None:
    s = Summary.from_dict(V1)
    assert s.schema == SUMMARY_SCHEMA == "perfscope.summary/2"
    assert isinstance(s.latency.ttft, Distribution)
    assert s.latency.ttft.p99 == V1["latency"]["ttft"]["p99"]
    assert s.counts.completed == 6
    assert isinstance(s.roofline.phases["decode"], PhaseRoofline)
    assert s.roofline.decode.mbu == V1["roofline"]["phases"]["decode"]["mbu"]
    assert s.roofline.decode.ceilings.peak_flops == 30.3e12
    assert s.hardware.device is not None and s.hardware.device.key == "l4"
    assert s.advice[0].projected_gain.unit == V1["advice"][0]["projected_gain"]["unit"]
    assert s.projections[0].memory.fits is True
    assert s.energy.available is False and "NVML" in (s.energy.reason or "")


def test_to_dict_gives_back_every_v1_value_under_schema_2() -> None:
    out = Summary.from_dict(V1).to_dict()
    assert out["schema"] == "perfscope.summary/2"

    def covered(old: object, new: object, path: str) -> None:
        if isinstance(old, dict):
            assert isinstance(new, dict), path
            for k, v in old.items():
                assert k in new, f"{path}.{k}"
                covered(v, new[k], f"{path}.{k}")
        elif isinstance(old, list):
            assert isinstance(new, list) and len(new) == len(old), path
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                covered(a, b, f"{path}[{i}]")
        elif path != ".schema":
            assert new == old, path

    covered(V1, out, "")
    assert Summary.from_dict(out) == Summary.from_dict(V1)


def test_unknown_keys_round_trip_but_are_not_attributes() -> None:
    data = {**V1, "cost": {"usd_per_mtok": 0.42}}
    data["latency"] = {**V1["latency"], "queue": {"count": 1, "p50": 0.1}}
    s = Summary.from_dict(data)
    assert s.to_dict()["cost"] == {"usd_per_mtok": 0.42}
    assert s.to_dict()["latency"]["queue"] == {"count": 1, "p50": 0.1}
    # extra only round-trips: a name the type does not know is an error, not a lookup.
    with pytest.raises(AttributeError):
        _ = s.cost  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        _ = s.latency.ttft.p42  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match=r"it has: .*p99"):
        _ = s.latency.ttft["p42"]


def test_sections_missing_from_an_old_summary_are_unavailable_with_a_reason() -> None:
    s = Summary.from_dict({"schema": "perfscope.summary/1", "counts": {"requests": 1}})
    assert s.roofline.available is False and "not in this summary" in (s.roofline.reason or "")
    assert s.energy.available is False
    assert s.hardware.device is None and s.hardware.reason
    assert s.advice == () and s.projections == ()
    with pytest.raises(AttributeError, match="roofline is not available"):
        _ = s.roofline.decode
    with pytest.raises(AttributeError, match="energy is not available"):
        _ = s.energy.j_per_token


def test_a_summary_is_a_record_not_a_mapping() -> None:
    s = Summary.from_dict(V1)
    assert not isinstance(s, Mapping)
    assert s.to_dict()["latency"]["ttft"]["p99"] == V1["latency"]["ttft"]["p99"]
    assert {k: v for k, v in s.to_dict()["counts"].items() if k in V1["counts"]} == V1["counts"]
    assert "roofline" in s and "nothing" not in s  # field names


def test_run_context_sections_are_typed_and_absent_ones_stay_out_of_the_json() -> None:
    data = {
        **V1,
        "contention": {"others_share": 0.3, "steal_share": 0.0, "contended": True},
        "run_set": {"id": "s-A", "label": "A", "index": 1, "repeat": 3},
        "prompt_cache": {"requests_reporting": 4, "requests_hit": 2, "hit_rate": 0.5},
    }
    s = Summary.from_dict(data)
    assert s.contention is not None and s.contention.contended is True
    assert s.run_set is not None and (s.run_set.index, s.run_set.repeat) == (1, 3)
    assert s.prompt_cache is not None and s.prompt_cache.hit_rate == 0.5
    assert s.server_metrics is None and s.model_spec is None
    out = s.to_dict()
    assert "server_metrics" not in out and "model_spec" not in out
    assert out["run_set"]["id"] == "s-A"


def test_every_catalogue_metric_resolves_in_a_real_summary_or_is_optional() -> None:
    s = Summary.from_dict(V1)
    found = [m for m in METRICS if m.value(s) is not None]
    assert {"ttft.p99", "output_tok_s", "attainment", "decode.mbu", "counts.failed"} <= {
        m.name for m in found
    }
    for m in METRICS:
        assert metric(m.name) is m and metric(m.path) is m
        assert m.path.split(".")[0] in s
    assert value_at(s, "latency.ttft.p99") == value_at(V1, "latency.ttft.p99")
    assert value_at(s, "roofline.phases.nothing.mbu") is None


def test_directions_say_which_way_is_better() -> None:
    assert metric("ttft.p99").better == "lower"
    assert metric("output_tok_s").better == "higher"
    assert metric("decode.mbu").better == "higher"
    assert metric("counts.requests").better is None


@pytest.mark.parametrize(
    ("value", "kind", "text"),
    [
        (2840.0, "seconds", "2,840 s"),
        (2.84, "seconds", "2.84 s"),
        (0.0123, "seconds", "12.3 ms"),
        (0.00085, "seconds", "850 µs"),
        (8.39e6, "bytes", "8.39 MB"),
        (1.5e9, "bytes", "1.5 GB"),
        (0.4213, "ratio", "42.1%"),
        (0.00061, "ratio", "0.061%"),
        (12345.4, "count", "12,345"),
        (3.2e12, "flop_per_s", "3.2 TFLOP/s"),
        (0.0036, "joules_per_token", "3.6 mJ/token"),
        (None, "seconds", "n/a"),
        (float("nan"), "bytes", "n/a"),
    ],
)
def test_display_picks_the_unit_by_magnitude(value: object, kind: str, text: str) -> None:
    assert format_value(value, kind) == text  # type: ignore[arg-type]


def test_no_format_ever_uses_exponent_notation() -> None:
    for v in (1e-9, 3e-7, 1.234e5, 9.99e14, 1e18):
        for f in (format_seconds, format_bytes, format_ratio, format_count):
            assert "e+" not in f(v) and "e-" not in f(v), (f, v)
    assert metric("output_tok_s").format(123456.0) == "123,456 tok/s"


def test_one_parser_reads_units_into_si() -> None:
    assert parse_duration("200ms") == pytest.approx(0.2)
    assert parse_duration("800us") == pytest.approx(8e-4)
    assert parse_quantity("8.4 MB") == (pytest.approx(8.4e6), "bytes")
    assert parse_quantity("50%")[0] == pytest.approx(0.5)
    with pytest.raises(UsageError, match="with a unit"):
        parse_duration("200")
    with pytest.raises(UsageError, match="not a seconds value"):
        parse_quantity("8 GB", kind="seconds")


def test_any_summary_path_gets_a_kind_and_a_direction() -> None:
    from perfscope.analysis.catalogue import better_of, kind_of

    assert kind_of("latency.ttft.p99") == "seconds"
    assert kind_of("energy.phases.decode.energy_j") == "joules"
    assert kind_of("roofline.phases.decode.achieved_bytes_s") == "bytes_per_s"
    assert kind_of("goodput.per_slo.ttft") == "ratio"
    assert kind_of("energy.power.avg_pct_of_limit") == "percent"
    assert better_of("latency.e2e.p90") == "lower"
    assert better_of("roofline.phases.prefill.mfu") == "higher"
    assert better_of("counts.requests") is None
    with pytest.raises(UsageError, match="this metric is in tok/s"):
        parse_quantity("5 req/s", kind="rate", unit="tok/s")


def test_the_client_section_is_a_record_whose_json_keeps_its_keys() -> None:
    from perfscope.analysis.client import client_section
    from perfscope.analysis.summary import Client

    stall = {"threshold_s": 0.01, "worst_s": 0.03, "requests": 2}
    manifest = {"engine": {"config": {"client": {"cpu_s": 1.5, "stamp_clock": "kernel"}}}}
    plain = client_section(manifest)
    assert isinstance(plain, Client) and plain.stall is None and plain.cpu_s == 1.5
    assert list(plain.to_dict()) == ["cpu_s", "peak_rss_bytes", "stamp_clock", "stall"]
    manifest["engine"]["config"]["client"]["stall"] = stall
    measured = client_section(manifest)
    assert measured is not None and measured.stall == stall
    assert client_section({"engine": {"config": {}}}) is None
