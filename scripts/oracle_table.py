"""Regenerate the family table and counts of ``docs/architectures.md`` from the registry
oracle (``tests/test_costmodel_registry_oracle.py``): every causal-LM family the installed
transformers lists, built tiny and measured, with perfscope's verdict on it.

The table's "before" column is the "now" column of the file's table at git revision
``--before`` (default ``HEAD``), so a run records what changed since then; the counts line
is rewritten the same way. Usage (two minutes or so on two busy cores)::

    python scripts/oracle_table.py [--before REV]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architectures.md"
HEADER = "| model_type | before | now | detail |"

#: The named convention an exact family is exact under, beyond those every family shares
#: (FLOPs as executed, as FlopCounterMode counts them; the embedding lookup free; fp32).
CONVENTIONS = {
    "deepseek_v2": "MLA expanded in decode, as transformers runs it",
    "deepseek_v3": "MLA expanded in decode, as transformers runs it",
    "kimi_k2": "MLA expanded in decode, as transformers runs it",
    "minicpm3": "MLA expanded in decode, as transformers runs it",
    "glm4_moe_lite": "MLA expanded in decode, as transformers runs it",
    "youtu": "MLA expanded in decode, as transformers runs it",
    "sarvam_mla": "MLA expanded in decode, as transformers runs it",
    "qwen3_next": "the delta rule's triangular solves and one-token recurrence count 0",
    "qwen3_5_text": "the delta rule's triangular solves and one-token recurrence count 0",
    "qwen3_5_moe_text": "the delta rule's triangular solves and one-token recurrence count 0",
    "olmo_hybrid": "the delta rule's triangular solves and one-token recurrence count 0",
    "kimi_linear": "MLA expanded in decode; the KDA rule's forward substitution and one-token "
    "recurrence (elementwise) count 0",
    "bailing_hybrid": "MLA expanded in decode; the KDA rule's forward substitution and "
    "one-token recurrence (elementwise) count 0",
}


#: What the family's layout exercises, where the row should say so.
NOTES = {
    "dbrx": "fused Wqkv, nested attn/ffn configs",
    "falcon": "multi-query, new decoder architecture with K/V groups, ALiBi; parallel attention",
    "falcon_h1": "attention and Mamba2 side by side in every block",
    "granitemoehybrid": "Mamba2 and attention blocks, MoE with a shared MLP",
    "jamba": "Mamba and attention blocks, MoE every other block",
    "bamba": "Mamba2 and attention blocks",
    "nemotron_h": "Mamba2, attention, MLP-only and MoE blocks",
    "lfm2": "short-conv and attention blocks",
    "lfm2_moe": "short-conv and attention blocks, dense then MoE",
    "qwen3_next": "gated-DeltaNet and gated-attention blocks, MoE with a gated shared expert",
    "qwen3_5_text": "gated-DeltaNet and gated-attention blocks",
    "qwen3_5_moe_text": "gated-DeltaNet and gated-attention blocks, MoE",
    "mamba2": "chunked SSD scan",
    "llama4_text": "chunked and full attention layers, interleaved MoE with a shared expert",
    "glm4_moe": "DeepSeek's expert layout",
    "minimax": "lightning-attention and softmax-attention blocks, MoE",
    "zamba2": "shared attention+MLP blocks with per-use adapters, Mamba2 blocks",
    "olmo_hybrid": "gated-DeltaNet and attention blocks",
    "kimi_linear": "Kimi Delta Attention and MLA blocks, MoE",
    "bailing_hybrid": "Kimi Delta Attention and gated MLA blocks, MoE",
    "gpt_bigcode": "multi-query or multi-head by multi_query",
    "olmo": "weightless LayerNorms",
    "lfm3": "short-conv, sliding and full attention blocks, gated heads, sandwich norms",
    "apertus": "xIELU's learned scalars",
    "hyperclovax": "optional post-norms",
    "afmoe": "gated attention, four norms per block, sliding layers, DeepSeek's expert layout",
    "minicpm5_moe": "a fused query-and-gate projection, DeepSeek's expert layout",
    "jais2": "biases by attention_bias / mlp_bias",
    "minicpm3": "DeepSeek-V2 latent attention, dense",
}


def _previous(text: str) -> dict[str, str]:
    """``model_type → verdict`` of the "now" column of the table in ``text``."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\| `([^`]+)` \| [^|]+ \| ([^|]+?) \|", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def _detail(kind: str, detail: str, model_type: str) -> str:
    if kind == "exact":
        what = "exact: FLOPs, weight bytes, KV/state bytes, parameters"
        # the oracle names the convention it had to apply after "; convention: "
        conv = detail.partition("; convention: ")[2] or CONVENTIONS.get(model_type)
        extra = [x for x in (NOTES.get(model_type), conv and f"convention: {conv}") if x]
        return f"{what} ({'; '.join(extra)})" if extra else what
    if kind == "refused":
        detail = detail.split(". Describe a decoder")[0].split(". If it is a Llama")[0]
        if "is not a decoder family perfscope can count" in detail:
            return "no reader for this family (generic refusal)"
        return detail.removeprefix(f"model_type {model_type!r} is not counted: ")
    return detail.replace("|", "/").replace("\n", " ")


def rows() -> list[tuple[str, str, str]]:
    """``(model_type, verdict, detail)`` for every family, from the oracle."""
    sys.path.insert(0, str(ROOT))
    warnings.simplefilter("ignore")
    from tests.test_costmodel_registry_oracle import FAMILIES, verdict

    out = []
    for mt in FAMILIES:
        kind, detail = verdict(mt)
        named = mt in CONVENTIONS or "; convention: " in detail
        label = "exact (convention)" if kind == "exact" and named else kind
        out.append((mt, label, _detail(kind, detail, mt)))
    return out


def render(text: str, table: list[tuple[str, str, str]], old_text: str) -> str:
    """``text`` with its family table and counts line replaced; "before" from ``old_text``."""
    before = _previous(old_text)
    lines = [HEADER, "|---|---|---|---|"]
    lines += [f"| `{mt}` | {before.get(mt, 'absent')} | {kind} | {d} |" for mt, kind, d in table]
    src = text.splitlines()
    start = src.index(HEADER)
    end = start + 1
    while end < len(src) and src[end].startswith("|"):
        end += 1
    src[start:end] = lines
    counts = collections.Counter(kind.split(" ")[0] for _, kind, _ in table)
    old = collections.Counter(v.split(" ")[0] for v in before.values())
    summary = (
        f"Counts of {len(table)} families: {counts['exact']} exact "
        f"(of which {sum(k == 'exact (convention)' for _, k, _ in table)} under a named "
        f"convention), {counts['refused']} refused, {counts['skipped']} skipped, "
        f"{counts['WRONG']} silently wrong; before: {old['exact']} exact, "
        f"{old['refused']} refused, {old['skipped']} skipped, {old['WRONG']} wrong."
    )
    marker = next((i for i, ln in enumerate(src) if ln.startswith("Counts of ")), None)
    if marker is None:
        src.insert(start - 1, summary)
        src.insert(start - 1, "")
    else:
        src[marker] = summary
    return "\n".join(src) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="HEAD", help="git revision of the 'before' column")
    args = ap.parse_args()
    rel = DOC.relative_to(ROOT).as_posix()
    old = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.before}:{rel}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    new = render(DOC.read_text(encoding="utf-8"), rows(), old)
    DOC.write_text(new, encoding="utf-8")
    print(next(ln for ln in new.splitlines() if ln.startswith("Counts of ")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
