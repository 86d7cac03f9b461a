"""The run index's columns and the metric catalogue say the same thing about a measurement.

The index lives in capture (``profiler/run_index/``), which may not import the analysis, so
it keeps its own column list; this test is what ties the two: every number the index reads
from a summary is a catalogue metric, in the unit the catalogue gives it."""

from __future__ import annotations

from perfscope.analysis.catalogue import find_metric
from perfscope.profiler.run_index.columns import COLUMN_UNITS, INDEX_COLUMNS

#: Catalogue kind (and a rate's noun) → the unit the index's docs print for it.
UNIT_OF_KIND = {
    ("seconds", ""): {"s"},
    ("rate", "tok/s"): {"tokens/s"},
    ("rate", "req/s"): {"requests/s"},
    ("ratio", ""): {"fraction (0-1)"},
    ("count", ""): {"count", "tokens"},
    ("joules_per_token", ""): {"J/token"},
}


def test_every_number_the_index_reads_from_a_summary_is_a_catalogue_metric_in_its_unit() -> None:
    numeric = [
        c
        for c in INDEX_COLUMNS
        if c.source == "summary" and c.sql_type in ("DOUBLE", "BIGINT") and c.reduce is None
    ]
    assert len(numeric) >= 20  # the latency, throughput, goodput and roofline columns
    for c in numeric:
        m = find_metric(c.path)
        assert m is not None, f"index column {c.name} reads {c.path}, not a catalogue metric"
        assert COLUMN_UNITS[c.name] in UNIT_OF_KIND[(m.kind, m.unit)], (c.name, m.kind)


def test_an_index_column_named_with_a_unit_suffix_holds_that_unit() -> None:
    suffixes = (("tok_s", "tokens/s"), ("req_s", "requests/s"), ("s", "s"))
    named = 0
    for c in INDEX_COLUMNS:
        for suffix, unit in suffixes:
            if c.name == suffix or c.name.endswith(f"_{suffix}"):
                assert COLUMN_UNITS[c.name] == unit, c.name
                named += 1
                break
    assert named >= 15
