"""``perfscope query`` and ``ls --where`` print the shared fitted table: short run ids that
every command takes back, values in their catalogue units, nothing cut at 80 or 120 columns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from perfscope.cli import build_parser
from perfscope.cli.tables import short_run_ids
from perfscope.profiler.store import resolve_run_path
from tests.data.runs.builders import complete_run, copy_run
from tests.test_terminal_widths import EXPONENT

# One real run and three copies: two share the hex end "89e2", one starts with "2026" as a
# hex end might.
IDS = (
    "20261205-230828-reference-89e2",
    "20261205-230829-online-89e2",
    "20261205-230830-reference-2026",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("table-runs")
    first = complete_run(root)
    for rid in IDS:
        copy_run(first, root, rid, name=rid.split("-")[2])
    return root


def _cli_text(argv: list[str], width: int) -> str:
    args = build_parser().parse_args(argv)
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    assert args.handler(args, console) == 0
    return console.export_text()


def test_a_short_id_is_the_shortest_end_no_other_id_starts_or_ends_with() -> None:
    universe = [*IDS, "20261205-230831-reference-77ea"]
    assert short_run_ids(["20261205-230831-reference-77ea"], universe) == ["77ea"]
    # Two runs end in 89e2: each keeps the part of its id that tells them apart.
    assert short_run_ids(list(IDS[:2]), universe) == ["reference-89e2", "online-89e2"]
    # "2026" is the start of every id: it would name them all, so the end grows.
    assert short_run_ids([IDS[2]], universe) == ["reference-2026"]
    # An id with no unique end stays whole.
    assert short_run_ids(["a-b"], ["a-b", "x-a-b"]) == ["a-b"]


@pytest.mark.parametrize("width", [80, 120])
def test_query_prints_short_ids_every_command_takes_and_catalogue_units(
    runs: Path, width: int
) -> None:
    sql = "SELECT run_id, started_at, ttft_p50_s, output_tok_s, window_s, decode_mfu FROM runs"
    text = _cli_text(["query", sql, "--runs-dir", str(runs)], width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    assert not EXPONENT.search(text), "no exponent notation"
    assert re.search(r"\d ms\b|\d µs\b|\d s\b", text) and "tok/s" in text and "%" in text
    for rid in [*IDS, *(p.name for p in runs.iterdir() if p.name.startswith("2"))]:
        assert rid not in text  # whole ids would not fit: shortened
    for short in ("reference-89e2", "online-89e2", "reference-2026"):
        assert re.search(rf"^\s*{short}\b", text, re.M), text
        # ... and each short id names its run to every command that takes a run id
        assert resolve_run_path(short, runs).name.endswith(short)
    assert "run ids shortened" in " ".join(text.split())


@pytest.mark.parametrize("width", [80, 120])
def test_ls_where_leaves_out_empty_columns_and_fits(runs: Path, width: int) -> None:
    text = _cli_text(["ls", "--where", "true", "--runs-dir", str(runs)], width)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    assert "no value in any row: reason" in " ".join(text.split())
    if width == 120:  # a table, one line a run, with plain ls's headers
        head = r"^\s*run\s+status\s+name\s+engine\s+requests\s+failed\s+TTFT p50\s+TPOT p50"
        assert re.search(head, text, re.M), text
        assert len(re.findall(r"complete", text)) == 4
