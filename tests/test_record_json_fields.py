"""A record's field typed as JSON (``perfscope.jsontypes``) resolves at run time and keeps the
value as read."""

from __future__ import annotations

from perfscope.analysis.summary import Projection, ProjectionCeilings, ProjectionWorkload, Summary


def test_a_json_object_field_reads_and_writes_its_object_as_it_was() -> None:
    workload = {"dataset": "synthetic", "prompt_len": {"kind": "fixed", "value": 16}}
    s = Summary.from_dict({"workload": workload, "model": {"name": "tiny", "n_layers": 2}})
    assert s.workload == workload
    assert s.model == {"name": "tiny", "n_layers": 2}
    assert s.to_dict()["workload"] == workload


def test_a_projection_reads_its_workload_and_ceilings_as_records_and_writes_the_same_keys() -> None:
    data = {
        "workload": {
            "batch": 4,
            "prompt_len": 128,
            "output_len": 32,
            "cached_prefix_len": 0,
            "tp": 2,
        },
        "ceilings": {
            "peak_flops": 1e15,
            "mem_bw_bytes_s": 3.35e12,
            "memory_level": "dram",
            "ridge_point": 298.5,
            "source": "datasheet",
        },
    }
    p = Projection.from_dict(data)
    assert p.workload == ProjectionWorkload(batch=4, prompt_len=128, output_len=32, tp=2)
    assert p.workload["tp"] == 2  # readers that index by key still work
    assert isinstance(p.ceilings, ProjectionCeilings) and p.ceilings.ridge_point == 298.5
    out = p.to_dict()
    assert out["workload"] == data["workload"] and out["ceilings"] == data["ceilings"]
    assert list(out["ceilings"]) == list(data["ceilings"])
