"""The bundled hardware database: files load, names are unique, lookups and units are right."""

from __future__ import annotations

import tomllib

import pytest

from perfscope.errors import UnknownDeviceError, UsageError
from perfscope.hwdb import BUILTIN_DIR, DTYPES, load_database, lookup, normalize_name


@pytest.fixture(scope="module")
def db():  # type: ignore[no-untyped-def]
    return load_database()


def test_every_bundled_file_loads_without_errors(db) -> None:  # type: ignore[no-untyped-def]
    files = sorted(BUILTIN_DIR.glob("*.toml"))
    assert db.errors == []
    assert len(files) == len(db.devices)
    assert len(db.devices) >= 35


def test_file_name_matches_key(db) -> None:  # type: ignore[no-untyped-def]
    for path in BUILTIN_DIR.glob("*.toml"):
        assert tomllib.loads(path.read_text())["key"] == path.stem


def test_issue_device_list_is_covered(db) -> None:  # type: ignore[no-untyped-def]
    wanted = [
        "v100-sxm2-32gb",
        "t4",
        "a10g",
        "a10",
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "a100-pcie-40gb",
        "a100-pcie-80gb",
        "l4",
        "l40s",
        "h100-sxm5-80gb",
        "h100-pcie-80gb",
        "h100-nvl-94gb",
        "h200-sxm-141gb",
        "h20-96gb",
        "b200",
        "gb200",
        "rtx-3090",
        "rtx-4090",
        "rtx-5090",
        "rtx-6000-ada",
        "rtx-a6000",
        "mi250x",
        "mi300x",
        "mi325x",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "gaudi2",
        "gaudi3",
        "apple-m2-ultra",
        "apple-m3-max",
        "apple-m4-max",
    ]
    assert [k for k in wanted if k not in db.devices] == []
    assert any(d.kind == "cpu" for d in db.devices.values())


def test_all_keys_and_names_are_unique_after_normalization(db) -> None:  # type: ignore[no-untyped-def]
    owner: dict[str, str] = {}
    for key, entry in db.entries.items():
        for name in entry.names():
            norm = normalize_name(name)
            assert owner.setdefault(norm, key) == key, (
                f"{name!r} of {key} clashes with {owner[norm]}"
            )


def test_every_number_has_a_source_and_sparse_peaks_are_not_ceilings(db) -> None:  # type: ignore[no-untyped-def]
    for key, entry in db.entries.items():
        spec = db.devices[key]
        for path, q in entry.quantities.items():
            assert q.sources, f"{key}: {path}"
            assert all(s.strip() for s in q.sources), f"{key}: {path}"
        assert set(spec.peak_flops) <= {*DTYPES, "fp4"}
        for dtype, sparse in spec.extra["sparse_peak_flops"].items():
            # a sparse figure is stored apart and is never the dense ceiling
            assert spec.peak_flops.get(dtype) != sparse
        assert spec.mem_bw_bytes_s > 0
        assert spec.peak_flops


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl-94gb"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-80GB", "a100-pcie-80gb"),
        ("Tesla T4", "t4"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H20", "h20-96gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI250X", "mi250x-gcd"),
        ("TPU v5 lite", "tpu-v5e"),
        ("TPU v4", "tpu-v4"),
        ("Apple M2 Ultra", "apple-m2-ultra"),
    ],
)
def test_raw_device_names_resolve_to_their_keys(db, raw: str, key: str) -> None:  # type: ignore[no-untyped-def]
    assert db.lookup(raw).key == key


@pytest.mark.parametrize(
    "spelling",
    [
        "nvidia a100-sxm4-80gb",
        "  NVIDIA   A100 SXM4 80GB ",
        "a100_sxm4_80gb",
        "A100-SXM4-80GB",
        "a100-sxm4-80gb",
    ],
)
def test_lookup_tolerates_case_spacing_and_punctuation(db, spelling: str) -> None:  # type: ignore[no-untyped-def]
    assert db.lookup(spelling).key == "a100-sxm4-80gb"


def test_vendor_words_are_optional(db) -> None:  # type: ignore[no-untyped-def]
    assert db.lookup("RTX 4090").key == "rtx-4090"
    assert db.lookup("H100 PCIe").key == "h100-pcie-80gb"


def test_unknown_device_suggests_nearest_keys(db) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnknownDeviceError) as info:
        db.lookup("A100")
    assert isinstance(info.value, UsageError)
    assert {"a100-sxm4-40gb", "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb"} <= set(
        info.value.suggestions
    )
    assert "a100-sxm4-80gb" in str(info.value)
    # a generic CPU name never silently becomes a specific SKU
    assert db.find("AMD EPYC") is None


def test_h100_sxm_units_are_converted_to_si() -> None:
    spec = lookup("h100")
    assert spec.key == "h100-sxm5-80gb"
    assert spec.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert spec.peak_flops_for("bfloat16") == pytest.approx(989.4e12)
    assert spec.mem_bw_bytes_s == pytest.approx(3.35e12)
    assert spec.mem_bytes == pytest.approx(80e9)
    assert spec.cache_bytes == pytest.approx(50e6)
    assert spec.tdp_w == pytest.approx(700.0)
    assert spec.peak_flops["int8"] == pytest.approx(1978.9e12)
    assert spec.extra["sparse_peak_flops"]["bf16"] == pytest.approx(1978.9e12)
    assert spec.extra["smem_per_sm_bytes"] == pytest.approx(228e3)
    assert spec.extra["interconnect_bytes_s"]["nvlink"] == pytest.approx(900e9)
    assert spec.source == "datasheet"
    assert spec.ridge_point("bf16") == pytest.approx(989.4e12 / 3.35e12)


def test_binary_and_other_units_convert(db) -> None:  # type: ignore[no-untyped-def]
    assert db.lookup("tpu-v4").mem_bytes == pytest.approx(32 * 2**30)  # 32 GiB
    assert db.lookup("a100-sxm4-80gb").mem_bw_bytes_s == pytest.approx(2.039e12)
    assert db.lookup("l4").peak_flops["int8"] == pytest.approx(242e12)  # TOPS
    assert db.lookup("b200").peak_flops["fp4"] == pytest.approx(9e15)


def test_estimates_are_marked(db) -> None:  # type: ignore[no-untyped-def]
    m3 = db.lookup("apple-m3-max")
    assert m3.source == "estimate"
    assert "dense.fp32" in m3.extra["estimated_fields"]
    assert db.lookup("h100-nvl-94gb").extra["fields"]["dense.tf32"]["estimate"] is True
    assert db.lookup("h100-nvl-94gb").extra["fields"]["dense.bf16"]["estimate"] is False
