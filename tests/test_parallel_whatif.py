"""Tensor/pipeline/replica what-ifs and the interconnect fields of the hardware database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfscope.analysis import costmodel as cm
from perfscope.analysis.modelspec import ModelSpec
from perfscope.analysis.parallel import (
    DEFAULT_COLLECTIVE_LATENCY_S,
    ParallelPlan,
    predict_parallel,
    ring_allreduce_time,
)
from perfscope.analysis.whatif import predict
from perfscope.cli import main
from perfscope.errors import UsageError
from perfscope.hwdb import resolve_device
from perfscope.hwdb._schema import DeviceFileError, entry_from_document, entry_to_spec
from perfscope.profiler.engines.reference.model import PRESETS

H100 = resolve_device("h100-sxm5-80gb")
LLAMA70 = ModelSpec.from_preset("llama-2-70b")
KW = {"batch": 1, "prompt_len": 512, "output_len": 128}


def test_ring_allreduce_formula() -> None:
    assert ring_allreduce_time(1e9, 1, 450e9, 8e-6) == 0.0
    assert ring_allreduce_time(1e9, 2, 450e9, 8e-6) == pytest.approx(8e-6 + 1e9 / 450e9)
    assert ring_allreduce_time(1e9, 4, 450e9, 0.0) == pytest.approx(1.5 * 1e9 / 450e9)


@pytest.mark.parametrize("tp", [2, 4])
def test_llama2_70b_tp_decode_all_reduce_by_hand(tp: int) -> None:
    r = predict_parallel(LLAMA70, H100, ParallelPlan(tp=tp), **KW)
    msg = 8192 * 2  # one token's hidden state in bf16
    assert r.allreduce_bytes_decode == msg
    assert r.collectives_per_step == 2 * 80 + 1
    link = 450e9  # NVLink 4: 900 GB/s bidirectional
    for lat, got in ((15e-6, r.tp_comm_decode_s), (8e-6, r.tp_comm_decode_optimistic_s)):
        per = lat + 2 * (tp - 1) / tp * msg / link
        gather = lat + (tp - 1) / tp * 32000 * 2 / link
        assert got == pytest.approx(161 * per + gather)
    assert r.tp_wait_decode_s == 0.0
    base = predict(LLAMA70, H100, tp=tp, **KW)
    assert r.compute_tpot_s == pytest.approx(base["tpot_s"])
    assert r.tpot_s == pytest.approx(base["tpot_s"] + r.tp_comm_decode_s)
    assert r.fits is True


def test_nccl_bus_bandwidth_override_and_latency_default() -> None:
    line = predict_parallel(
        LLAMA70, H100, ParallelPlan(tp=2), batch=64, prompt_len=512, output_len=2
    )
    nccl = predict_parallel(
        LLAMA70,
        H100,
        ParallelPlan(tp=2),
        batch=64,
        prompt_len=512,
        output_len=2,
        link_bw_bytes_s=370e9,
    )
    # prefill messages are large (64 x 512 x 8192 x 2 B): bandwidth-bound, ratio ~ 450/370
    lat = 162 * 15e-6
    ratio = (nccl.tp_comm_prefill_s - lat) / (line.tp_comm_prefill_s - lat)
    assert ratio == pytest.approx(450 / 370, rel=1e-3)
    l4 = resolve_device("l4")  # PCIe only, no latency in its file
    r = predict_parallel(ModelSpec.from_preset("llama-3-8b"), l4, ParallelPlan(tp=2), **KW)
    assert r.link is not None and r.link.name == "pcie"
    assert r.link.latency_s == DEFAULT_COLLECTIVE_LATENCY_S
    assert r.link.bw_bytes_s == pytest.approx(32e9)


def test_pipeline_bubble_stage_memory_and_throughput() -> None:
    spec = ModelSpec.from_preset("llama-2-13b")
    one = predict_parallel(spec, H100, ParallelPlan(), batch=8, prompt_len=512, output_len=64)
    pp = predict_parallel(
        spec,
        H100,
        ParallelPlan(pp=4, microbatches=4, in_flight=4),
        batch=8,
        prompt_len=512,
        output_len=64,
    )
    assert pp.bubble_prefill == pytest.approx(3 / 7)
    assert pp.bubble_decode == 0.0
    # weights are split over the stages; 4 batches in flight hold 4x the KV
    kv = 4 * 8 * cm.kv_cache_bytes_per_sequence(spec, 576)
    assert sum(pp.stage_memory_bytes) == pytest.approx(cm.weight_bytes(spec) + kv)
    # decode: a token still passes every stage, but 4 batches share the pipeline
    assert pp.tpot_s == pytest.approx(one.tpot_s + pp.pp_comm_decode_s)
    # up to 4x the throughput of one device (4 devices, no bubble once 4 batches flow)
    assert 3.0 < pp.throughput_tok_s / one.throughput_tok_s <= 4.0
    fewer = predict_parallel(
        spec, H100, ParallelPlan(pp=4, in_flight=1), batch=8, prompt_len=512, output_len=64
    )
    assert fewer.bubble_decode == pytest.approx(0.75)
    with pytest.raises(UsageError, match="exceeds"):
        predict_parallel(spec, H100, ParallelPlan(pp=41), **KW)


def test_replicas_multiply_throughput_only() -> None:
    one = predict_parallel(LLAMA70, H100, ParallelPlan(tp=2), **KW)
    four = predict_parallel(LLAMA70, H100, ParallelPlan(tp=2, replicas=4), **KW)
    assert four.plan.devices == 8
    assert four.tpot_s == one.tpot_s and four.ttft_s == one.ttft_s
    assert four.throughput_tok_s == pytest.approx(4 * one.throughput_tok_s)
    assert any("replicas" in a for a in four.assumptions)


def test_device_without_a_link_needs_one_given() -> None:
    cpu = resolve_device("epyc-9654")
    with pytest.raises(UsageError, match="--link-bw"):
        predict_parallel(LLAMA70, cpu, ParallelPlan(tp=2), **KW)
    r = predict_parallel(LLAMA70, cpu, ParallelPlan(tp=2), link_bw_bytes_s=50e9, **KW)
    assert r.link is not None and r.link.bw_bytes_s == 50e9


def test_mla_latent_is_replicated_across_tp() -> None:
    spec = ModelSpec.from_preset("deepseek-v3").with_dtypes(weight_dtype="fp8")
    r = predict_parallel(spec, resolve_device("h200-sxm-141gb"), ParallelPlan(tp=8), **KW)
    kv = cm.kv_cache_bytes_per_sequence(spec, 640)
    assert r.stage_memory_bytes[0] == pytest.approx(cm.weight_bytes(spec) / 8 + kv)
    assert any("MLA latent" in a for a in r.assumptions)


# ---------------------------------------------------------------------- hardware database


def test_device_files_carry_usable_memory_links_and_latency() -> None:
    assert H100.mem_bytes == 80e9
    assert H100.mem_usable_bytes == 81559 * 2**20
    assert H100.scale_up_link() == ("nvlink", 450e9)
    assert H100.scale_up_link("pcie") == ("pcie", 64e9)
    assert H100.collective_latency_s == {}  # the default range applies
    assert H100.extra["interconnect_bytes_s"] == {"nvlink": 900e9, "pcie": 128e9}
    assert resolve_device("mi300x").scale_up_link() == ("infinity_fabric", 448e9)
    assert resolve_device("tpu-v5e").scale_up_link() == ("ici", 200e9)
    nvl = resolve_device("h200-nvl-141gb")
    assert nvl.peak_flops_for("fp8") == pytest.approx(1670.5e12)
    assert resolve_device("gaudi3").tdp_w == 900
    assert resolve_device("mi250x").peak_flops_for("fp32") == pytest.approx(95.7e12)
    round_trip = type(H100).from_dict(json.loads(json.dumps(H100.to_dict())))
    assert round_trip == H100


def test_latency_needs_a_time_unit(tmp_path: Path) -> None:
    doc = {
        "key": "x",
        "name": "X",
        "vendor": "v",
        "kind": "gpu",
        "memory": {"bandwidth": {"value": 1, "unit": "TB/s", "source": "a b"}},
        "dense": {"bf16": {"value": 1, "unit": "TFLOPS", "source": "a b"}},
        "interconnect": {"nvlink_latency": {"value": 5, "unit": "GB/s", "source": "a b"}},
    }
    with pytest.raises(DeviceFileError, match="not a time unit"):
        entry_from_document(doc, tmp_path / "x.toml")
    doc["interconnect"] = {"nvlink_latency": {"value": 5, "unit": "us", "source": "a b"}}
    spec = entry_to_spec(entry_from_document(doc, tmp_path / "x.toml"))
    assert spec.collective_latency_s == {"nvlink": pytest.approx(5e-6)}


# ---------------------------------------------------------------------- CLI


def test_roofline_cli_reports_parallel_whatif_with_weight_dtype(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(
        [
            "roofline",
            "--model",
            "llama-2-70b",
            "--hw",
            "h100-sxm5-80gb",
            "--tp",
            "2",
            "--replicas",
            "2",
            "--weight-dtype",
            "int4",
            "--kv-dtype",
            "fp8",
            "--json",
        ]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["weight_dtype"] == "int4"
    assert data["model"]["unquantized_bytes_per_param"] == 2.0  # lm_head/embedding 16-bit
    par = data["parallel"][0]
    assert par["devices"] == 4 and par["tp_comm_decode_s"] > 0
    assert par["link"]["name"] == "nvlink"


def test_roofline_cli_rejects_bad_parallel_degrees(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["roofline", "--model", "gpt2", "--hw", "h100-sxm5-80gb", "--pp", "0"]) == 2
    assert "--pp must be at least 1" in capsys.readouterr().err


def test_llama2_70b_tp8_h100_decode_comm_at_both_latency_ends() -> None:
    r = predict_parallel(LLAMA70, H100, ParallelPlan(tp=8), **KW)
    # 161 all-reduces of 16 KiB + a 64 KB logits gather at 450 GB/s: 161 x 15 us + 15 us
    # + bytes = 2.44 ms typical; 161 x 8 us + 8 us + bytes = 1.31 ms optimistic
    assert r.tp_comm_decode_s == pytest.approx(2.44e-3, rel=5e-3)
    assert r.tp_comm_decode_optimistic_s == pytest.approx(1.31e-3, rel=5e-3)
    text = " ".join(r.assumptions)
    assert "typical end is used" in text and "no wait term: a lower bound" in text


def test_measured_wait_term_is_added_per_synchronising_collective() -> None:
    dev = resolve_device("cpu-loopback-gloo")
    assert dev.collective_wait_s == {"loopback": pytest.approx(1167e-6)}
    tiny = ModelSpec.from_dict(PRESETS["tiny"].model_spec())  # 2 blocks, d 128, vocab 1024, fp32
    kw = {"batch": 4, "prompt_len": 32, "output_len": 32}
    r = predict_parallel(tiny, dev, ParallelPlan(tp=2), **kw)
    assert r.link is not None and r.link.wait_s == pytest.approx(1167e-6)
    # 2 blocks: 5 all-reduces + the logits gather, each waiting 1.167 ms for the other rank
    assert r.tp_wait_decode_s == pytest.approx(6 * 1167e-6)
    bw, lat = 0.461e9 / 2, 1288e-6
    per = lat + 2 * (1 / 2) * 4 * 128 * 4 / bw
    gather = lat + (1 / 2) * 4 * 1024 * 4 / bw
    assert r.tp_comm_decode_s == pytest.approx(5 * per + gather + 6 * 1167e-6)
    assert "measured" in r.link.source and "lower bound" not in r.link.source


def test_pipeline_decode_counts_the_token_return_hop() -> None:
    dev = resolve_device("cpu-loopback-gloo")
    tiny = ModelSpec.from_dict(PRESETS["tiny"].model_spec())  # 2 blocks, d 128, vocab 1024, fp32
    r = predict_parallel(tiny, dev, ParallelPlan(pp=2), batch=4, prompt_len=32, output_len=32)
    bw, lat = 0.461e9 / 2, 1288e-6
    hidden = lat + 4 * 128 * 4 / bw  # activations of 4 rows to stage 1
    back = lat + 4 * 8 / bw  # 4 int64 token ids back to stage 0
    assert r.pp_comm_decode_s == pytest.approx(hidden + back)
    assert "return hop" in " ".join(r.assumptions)


def test_pipeline_hops_wait_like_collectives_where_the_link_measured_a_wait() -> None:
    """Each PP hop is a blocking receive: on the loopback link (measured wait 1.167 ms per
    synchronisation) a decode step of 2 stages waits at its forward hop and its return hop,
    the prefill at its one forward hop; a link with no measured wait adds none."""
    dev = resolve_device("cpu-loopback-gloo")
    tiny = ModelSpec.from_dict(PRESETS["tiny"].model_spec())
    kw = {"batch": 4, "prompt_len": 32, "output_len": 32}
    r = predict_parallel(tiny, dev, ParallelPlan(pp=2), **kw)
    assert r.pp_wait_decode_s == pytest.approx(2 * 1167e-6)
    assert r.pp_wait_prefill_s == pytest.approx(1167e-6)
    assert r.tpot_s == pytest.approx(r.compute_tpot_s + r.pp_comm_decode_s + 2 * 1167e-6)
    assert "waits 1.17 ms for the receiving stage" in " ".join(r.assumptions)
    spec = ModelSpec.from_dict(PRESETS["small"].model_spec())
    h = predict_parallel(spec, H100, ParallelPlan(pp=2), **kw)
    assert h.pp_wait_decode_s == 0.0 and h.pp_wait_prefill_s == 0.0
