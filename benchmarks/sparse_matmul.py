"""Does unstructured sparsity pay on this CPU? Dense vs torch.sparse CSR linear layers.

For each weight shape of the reference model's blocks (``--preset``, default ``small``:
q/o 512x512, k/v 128x512, gate/up 1408x512, down 512x1408) and each token count (decode: a
batch of rows; prefill: many tokens), times ``F.linear(x, W)`` with ``W`` dense and with
``W`` magnitude-pruned to each ``--densities`` and stored as CSR (what
``--engine-opt sparsity=unstructured:F`` runs). Interleaved rounds (dense, CSR 0.5, CSR
0.3, ... repeated), median of ``--repeats`` timings of ``--iters`` calls each, float32,
``torch.set_num_threads(--threads)``.

Prints one row per (tokens, density): the summed time over one block's seven matrices,
the ratio CSR / dense (below 1: sparsity pays), and the bytes each format stores (CSR:
values + int64 column indices + row pointers).

    .venv/bin/python benchmarks/sparse_matmul.py [--preset small] [--tokens 1,16,256]
        [--densities 0.5,0.3,0.1] [--repeats 7] [--iters 20] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings

import torch

from perfscope.profiler.engines.reference.model import PRESETS, Sparsity, magnitude_mask


def _shapes(preset: str) -> list[tuple[int, int]]:
    c = PRESETS[preset]
    d, hd, f = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.n_heads * hd, c.n_kv_heads * hd
    return [(q, d), (kv, d), (kv, d), (d, q), (f, d), (f, d), (d, f)]


def _time(fn: object, x: torch.Tensor, iters: int) -> float:
    assert callable(fn)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(x)
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tokens", default="1,16,256")
    ap.add_argument("--densities", default="0.5,0.3,0.1")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    dens = [float(v) for v in a.densities.split(",")]
    weights = [torch.randn(o, i, generator=gen) * 0.02 for o, i in _shapes(a.preset)]
    formats: dict[str, list[torch.Tensor]] = {"dense": weights}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for p in dens:
            sp = Sparsity("unstructured", 1.0 - p)
            formats[f"csr {p:g}"] = [(w * magnitude_mask(w, sp)).to_sparse_csr() for w in weights]

    def nbytes(ws: list[torch.Tensor]) -> int:
        total = 0
        for w in ws:
            parts = (w.values(), w.col_indices(), w.crow_indices()) if w.is_sparse_csr else (w,)
            total += sum(t.numel() * t.element_size() for t in parts)
        return total

    rows = []
    for n in (int(v) for v in a.tokens.split(",")):
        xs = [torch.randn(n, w.shape[1], generator=gen) for w in weights]
        times: dict[str, list[float]] = {k: [] for k in formats}
        for _ in range(a.repeats):  # interleaved: drifts of a shared machine hit all alike
            for name, ws in formats.items():
                total = 0.0
                for w, x in zip(ws, xs, strict=True):
                    total += _time(lambda x, w=w: torch.nn.functional.linear(x, w), x, a.iters)
                times[name].append(total)
        dense = statistics.median(times["dense"])
        for name in formats:
            med = statistics.median(times[name])
            rows.append(
                {
                    "tokens": n,
                    "format": name,
                    "median_s": med,
                    "ratio_vs_dense": med / dense,
                    "bytes": nbytes(formats[name]),
                }
            )
    load = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"load_avg_1m": load, "threads": a.threads, "rows": rows}, indent=2))
        return
    print(f"load average (1 min) {load:.1f}, threads {a.threads}, preset {a.preset}")
    print("| tokens | format | one block's linears, median ms | vs dense | stored MB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tokens']} | {r['format']} | {r['median_s'] * 1e3:.3g} "
            f"| {r['ratio_vs_dense']:.2f}x | {r['bytes'] / 1e6:.3g} |"
        )


if __name__ == "__main__":
    main()
