"""Projection error of stored studies before and after a change of the projection model.

Each study is re-projected from its own measured runs (``perfscope.api.study.
reproject_study``) twice: with the baseline's derating and no queueing (the model before
issue 28's fitted cost model), and with the baseline runs' fitted cost model and the load's
queueing (now). The measured effects are the same in both; only the projections differ.

Run::

    python benchmarks/reproject_studies.py --runs-dir RUNS STUDY.json ... [--save DIR]

``--save DIR`` writes each re-projected study (``perfscope.study/1``) to ``DIR`` with run
ids instead of run paths and the study's own path relative to the working directory, so a
stored record names no temporary folder.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from perfscope.analysis.study import Study
from perfscope.api.study import portable_study, reproject_study
from perfscope.profiler.store import write_json_atomic

#: Metrics a projection is checked on (the study metrics with a projection).
CHECKED = ("ttft_p50_s", "tpot_p50_s", "output_tok_s")


def _rows(s: Study) -> list[tuple[str, str, float, float | None, bool]]:
    """(change, metric, measured ratio, projected ratio, significant) of every effect."""
    out = []
    for st in s.settings[1:]:
        for e in st.effects:
            if e.metric not in CHECKED or e.change.ratio is None:
                continue
            ci = e.change.ci
            sig = ci is not None and (ci[0] > 1.0 or ci[1] < 1.0)
            out.append(
                (
                    f"{s.knob} {s.values[0]} -> {st.value}",
                    e.metric,
                    e.change.ratio,
                    e.projected_ratio,
                    sig,
                )
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--runs-dir", required=True, type=Path)
    ap.add_argument("--save", type=Path, default=None)
    a = ap.parse_args()
    errs: dict[str, list[float]] = {"before": [], "after": []}
    errs_all: dict[str, list[float]] = {"before": [], "after": []}
    print("| change | metric | measured | significant | before | error | after | error |")
    print("|---|---|---|---|---|---|---|---|")
    for path in a.studies:
        old = reproject_study(path, a.runs_dir, fitted=False, queueing=False)
        new = reproject_study(path, a.runs_dir)
        for r0, r1 in zip(_rows(old), _rows(new), strict=True):
            change, metric, measured, p0, sig = r0
            p1 = r1[3]
            cells = []
            for name, p in (("before", p0), ("after", p1)):
                if p is None:
                    cells += ["–", "–"]
                    continue
                err = p / measured - 1.0
                errs_all[name].append(abs(err))
                if sig:
                    errs[name].append(abs(err))
                cells += [f"{p:.3g}x", f"{100 * err:+.0f}%"]
            print(
                f"| {change} | {metric} | {measured:.3g}x | {'yes' if sig else 'no'} | "
                + " | ".join(cells)
                + " |"
            )
        if a.save is not None:
            target = a.save / Path(path).name
            a.save.mkdir(parents=True, exist_ok=True)
            write_json_atomic(target, portable_study(new, target).to_dict())
    print()
    for name in ("before", "after"):
        sig, every = errs[name], errs_all[name]
        print(
            f"{name}: median |error| over significant effects "
            + (f"{100 * statistics.median(sig):.0f}% ({len(sig)})" if sig else "– (none)")
            + "; over all effects "
            + (f"{100 * statistics.median(every):.0f}% ({len(every)})" if every else "–")
        )


if __name__ == "__main__":
    main()
