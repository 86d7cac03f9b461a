"""Study: prefill/decode disaggregation, off vs on (``--engine-opt disaggregate=on``).

Four users in a closed loop with prompts of 32 to 256 tokens and 16 output tokens, so long
prompts keep arriving while other requests decode. Off: one engine process, every decoding
request waits for each prefill pass. On: prefill in one process, decode in another, each
request's KV cache handed over through shared memory (timed per request, in the run's
manifest under ``engine.config.handoff``). One thread per process: "on" uses two cores,
"off" one.

Run: `python samples/studies/disaggregation.py` (a few minutes) or `--smoke` (seconds);
`--save` stores the study in samples/studies/results. The write-up is `disaggregation.md`.
"""

import json
import statistics
from pathlib import Path
from typing import Any

from _common import run_study


def handoff_table(s: Any) -> str:
    """Per setting, the hand-offs of its runs (from each run's manifest)."""
    lines = [
        "| disaggregate | hand-offs | KB per request (mean) | hand-off ms p50 | ms max "
        "| copy out / transit / copy in ms p50 | wait for a slot ms p50 |",
        "|---|---|---|---|---|---|---|",
    ]
    for st in s.settings:
        rows: list[dict[str, Any]] = []
        for p in st.runs:
            man = json.loads((Path(p.run) / "manifest.json").read_text())
            rows += ((man["engine"]["config"].get("handoff") or {}).get("per_request")) or []
        if not rows:
            lines.append(f"| {st.value} | 0 | – | – | – | – | – |")
            continue

        def p50(key: str, rows: list[dict[str, Any]] = rows) -> float:
            return 1e3 * statistics.median(r[key] for r in rows)

        total = [r["copy_out_s"] + r["transit_s"] + r["copy_in_s"] for r in rows]
        lines.append(
            f"| {st.value} | {len(rows)} | {statistics.mean(r['nbytes'] for r in rows) / 1e3:.4g} "
            f"| {1e3 * statistics.median(total):.3g} | {1e3 * max(total):.3g} "
            f"| {p50('copy_out_s'):.3g} / {p50('transit_s'):.3g} / {p50('copy_in_s'):.3g} "
            f"| {p50('wait_s'):.3g} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    study = run_study(
        "disaggregate",
        "off,on",
        doc=__doc__ or "",
        smoke={"prompt_len": 12, "concurrency": 2},
        model_preset="small",
        batch_size=4,
        concurrency=4,
        requests=12,
        prompt_len="uniform:32:256",
        output_len=16,
        repeat=8,  # 6 rounds cannot give the secondaries (tested at 99%) an interval
        threads=1,
    )
    print()
    print(handoff_table(study))
