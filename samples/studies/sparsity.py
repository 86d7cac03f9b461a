"""Study: magnitude pruning of the block linears run as torch.sparse CSR matmuls (50% and
90% zeros) on a trained tiny model; 2:4 needs CUDA and is refused on a CPU.

Run: `python samples/studies/sparsity.py` (about a minute) or `--smoke` (seconds).
`--quality-only --save` measures only each setting's quality on the trained model (no
speed run) and stores it in `results/sparsity/`, which the write-up's quality table renders.
The write-up with the measured table is `sparsity.md`; the per-matrix speed on the small
preset's shapes is `benchmarks/sparse_matmul.py`.
"""

from _common import run_study

if __name__ == "__main__":
    run_study(
        "sparsity",
        "none,unstructured:0.5,unstructured:0.9",
        doc=__doc__ or "",
        smoke_values="none,unstructured:0.5",
        model_preset="tiny",
        requests=8,
        prompt_len=32,
        output_len=16,
        repeat=3,
        with_quality=True,
        weights="trained",
        threads=1,
    )
