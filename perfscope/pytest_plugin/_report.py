"""What a perf session leaves behind: the JSON report for CI (``--perfscope-json``) and
the saved baseline (``--perfscope-save``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from perfscope.jsontypes import JsonObject, JsonValue
from perfscope.pytest_plugin._state import SessionState

__all__ = ["REPORT_SCHEMA", "report", "save_baseline", "write_json_report"]

REPORT_SCHEMA = "perfscope.pytest/1"


def report(state: SessionState, exitstatus: int) -> JsonObject:
    """The session's JSON report (schema :data:`REPORT_SCHEMA`): every perf test's runs,
    key metrics, assertions and comparisons, the machine, the commit and the baseline."""
    tests: list[JsonValue] = []
    for rec in state.perf_records():
        tests.append(
            {
                "nodeid": rec.nodeid,
                "outcome": rec.outcome,
                "measurements": [
                    {
                        "key": m.key,
                        "label": m.label,
                        "run_dirs": list(m.run_dirs),
                        "metrics": {k: v.to_dict() for k, v in m.metrics.items()},
                        "assertions": [
                            o.to_dict() | {"source": src} for mm, o, src in rec.outcomes if mm is m
                        ],
                        "comparisons": [c.to_dict() for c in rec.comparisons if c.key == m.key],
                    }
                    for m in rec.measurements
                ],
            }
        )
    failed_assertions = sum(
        1 for r in state.records.values() for _, o, _ in r.outcomes if not o.passed
    )
    regressions = state.regressions()
    baseline: JsonObject | None = None
    if state.baseline is not None:
        saved = state.baseline
        baseline = {
            "name": state.compare,
            "path": str(state.baseline_file),
            "created_at": saved.created_at,
            "machine": saved.machine.to_dict() if saved.machine is not None else None,
            "commit": saved.commit.to_dict() if saved.commit is not None else None,
            "forced": bool(state.mismatch),
        }
    from perfscope.pytest_plugin._baseline import commit_info

    return {
        "schema": REPORT_SCHEMA,
        "created_at": datetime.now(UTC).isoformat(),
        "passed": exitstatus == 0 and not regressions and not failed_assertions,
        "exit_status": int(exitstatus),
        "failed_assertions": failed_assertions,
        "regressions": len(regressions),
        "machine": state.machine().to_dict(),
        "commit": commit_info(Path(state.config.rootpath)).to_dict(),
        "baseline": baseline,
        "tests": tests,
    }


def write_json_report(state: SessionState, exitstatus: int) -> None:
    """Write :func:`report` to ``--perfscope-json`` (when given)."""
    if state.json_path is None:
        return
    data = report(state, exitstatus)
    state.json_path.parent.mkdir(parents=True, exist_ok=True)
    state.json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    state.notes.append(f"JSON report written to {state.json_path}")


def save_baseline(state: SessionState) -> None:
    from perfscope.errors import UsageError
    from perfscope.pytest_plugin._baseline import BaselineTest, baseline_path, commit_info
    from perfscope.pytest_plugin._baseline import save_baseline as write_baseline

    assert state.save is not None
    tests: dict[str, BaselineTest] = {}
    for rec in state.perf_records():
        for m in rec.measurements:
            if m.metrics:
                tests[m.key] = BaselineTest(
                    nodeid=rec.nodeid,
                    label=m.label,
                    outcome=rec.outcome,
                    run_dirs=tuple(m.run_dirs),
                    metrics=m.metrics,
                )
    if not tests:
        state.notes.append(f"baseline {state.save!r} not saved: no perf test made a run")
        return
    try:
        path = baseline_path(state.storage, state.save)
    except UsageError as exc:
        state.notes.append(f"baseline not saved: {exc}")
        return
    _, note = write_baseline(
        path,
        name=state.save,
        machine=state.machine(),
        commit=commit_info(Path(state.config.rootpath)),
        tests=tests,
    )
    state.notes.append(f"baseline {state.save!r} {note}: {len(tests)} measurement(s) in {path}")
