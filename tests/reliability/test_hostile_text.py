"""Outside strings (server error text, model ids, run names) reach the terminal as inert text
through every command: no terminal control sequence, no rich markup, no emoji, no traceback;
and a terminal that cannot encode UTF-8 gets ASCII, not a ``UnicodeEncodeError``."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.cli.safe import SafeConsole, safe_markup, safe_text
from tests.reliability.helpers import cli
from tests.reliability.hostile import BOUNDED_RUN, HOSTILE_TEXT, base_url, hostile_server

pytestmark = pytest.mark.slow

CONTROL_BYTES = ("\x1b", "\x07", "\x9b", "\x9d")


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two runs against a server whose errors carry terminal attacks and markup; the
    model id is hostile too. Returns (runs folder, the first run's combined output)."""
    runs = tmp_path_factory.mktemp("hostile") / "runs"
    outs = []
    for _ in range(2):
        with hostile_server(["ok", "error_text", "ok", "error_text"]) as srv:
            res = cli(
                "run",
                f"openai:{base_url(srv)}",
                "--model",
                "m\x1b]0;title\x07[/]:x:",
                "--requests",
                "4",
                *BOUNDED_RUN,
                runs=runs,
            )
        outs.append(res.stdout + res.stderr)
    return runs, outs[0]


def _assert_inert(out: str, where: str) -> None:
    for c in CONTROL_BYTES:
        assert c not in out, f"{where}: raw control {c!r} reached the terminal"
    assert "Traceback" not in out and "MarkupError" not in out, f"{where}: {out[-2000:]}"
    assert "❌" not in out, f"{where}: ':x:' became an emoji"


@pytest.mark.fault(
    fault="server error text with OSC 52, screen clear, OSC 8 and rich markup",
    before="escapes reached the terminal raw; `[/]` a MarkupError traceback (issue 26)",
    after="printed escaped (`\\x1b]52;...`), brackets literal",
    kept="display only: nothing captured changes",
)
def test_run_output_shows_server_error_text_escaped(hostile_runs: tuple[Path, str]) -> None:
    _runs, out = hostile_runs
    _assert_inert(out, "run")
    assert "\\x1b]52;c;" in out, "the attack is shown, escaped, so the user sees it"
    assert "[/]" in out and "[link=http://evil.example]" in out, "markup shown as text"


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "latest"),
        ("ls",),
        ("ls", "--json"),
        ("show", "latest", "--json"),
        ("export", "latest", "--format", "json", "-o", "-"),
    ],
    ids=lambda a: "-".join(x.strip("-") for x in a[:3]),
)
@pytest.mark.fault(
    fault="hostile run names, model ids and errors through every command",
    before="raw escapes, markup read as markup, tracebacks in ls/show/query (issue 26)",
    after="every command prints them inert, exit 0",
    kept="display only: nothing captured changes",
)
def test_every_command_prints_the_hostile_strings_inert(
    hostile_runs: tuple[Path, str], argv: tuple[str, ...]
) -> None:
    runs, _ = hostile_runs
    res = cli(*argv, runs=runs)
    assert res.returncode == 0, res.stderr
    _assert_inert(res.stdout + res.stderr, " ".join(argv))


@pytest.mark.fault(
    fault="hostile strings in `compare` and `query` output",
    before="`:x:` became an emoji, `[link=...]` a clickable link (issue 26)",
    after="printed inert, exit 0",
    kept="display only: nothing captured changes",
)
def test_compare_and_query_print_the_hostile_strings_inert(
    hostile_runs: tuple[Path, str],
) -> None:
    runs, _ = hostile_runs
    a, b = sorted(p.name for p in runs.iterdir() if p.is_dir())
    res = cli("compare", a, b, runs=runs)
    assert res.returncode == 0, res.stderr
    _assert_inert(res.stdout + res.stderr, "compare")
    res = cli("query", "SELECT run_id, model, problem FROM runs", runs=runs)
    _assert_inert(res.stdout + res.stderr, "query")


@pytest.mark.parametrize(
    "env",
    [{"LC_ALL": "C", "LANG": "C"}, {"PYTHONIOENCODING": "ascii"}],
    ids=["LC_ALL=C", "PYTHONIOENCODING=ascii"],
)
@pytest.mark.fault(
    fault="an ASCII terminal (`LC_ALL=C`, `PYTHONIOENCODING=ascii`)",
    before="`ls` and `show` died on non-ASCII signs (issue 26)",
    after="ASCII output, no UnicodeEncodeError",
    kept="display only: nothing captured changes",
)
def test_non_utf8_terminals_get_ascii_not_a_traceback(
    hostile_runs: tuple[Path, str], env: dict[str, str]
) -> None:
    runs, _ = hostile_runs
    for argv in (("ls",), ("show", "latest")):
        res = cli(*argv, runs=runs, **env)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr and "UnicodeEncodeError" not in res.stderr
        assert res.stdout.isascii(), [c for c in res.stdout if not c.isascii()][:5]
        assert len(res.stdout) > 100


@pytest.mark.fault(
    fault="control characters, a bidi override, long text and markup given to the helpers",
    before="no rendering helper (issue 26)",
    after="escaped, capped with `...`, markup escaped",
    kept="display only: nothing captured changes",
)
def test_safe_text_escapes_controls_and_safe_markup_escapes_markup() -> None:
    assert safe_text("a\x1b]52;c;x\x07b\nc") == "a\\x1b]52;c;x\\x07b\\nc"
    assert safe_text("\u202eevil") == "\\u202eevil"
    assert safe_text("x" * 50, max_len=10) == "xxxxxxx..."
    assert safe_markup("[/] [link=u]t[/link]") == "\\[/] \\[link=u]t\\[/link]"


@pytest.mark.fault(
    fault="links, unbalanced markup, emoji codes and escapes reaching the console",
    before="links clickable, `[/]` a MarkupError, `:x:` an emoji (issue 26)",
    after="the console backstop prints them as text, drops links and escapes",
    kept="display only: nothing captured changes",
)
def test_safe_console_backstop_drops_links_and_bad_markup_and_emoji() -> None:
    import io

    buf = io.StringIO()
    con = SafeConsole(
        file=buf, force_terminal=True, width=200, color_system="truecolor", highlight=False
    )
    con.print("[/] unbalanced")  # raw: a MarkupError in a plain Console
    con.print("[link=http://evil.example]click[/link] :x:")
    con.print(HOSTILE_TEXT, markup=False)
    out = buf.getvalue()
    assert "[/] unbalanced" in out
    assert "\x1b]8;" not in out, "no OSC 8 hyperlink is emitted"
    assert ":x:" in out and "❌" not in out
    assert "\x1b]52" not in out and "\x07" not in out
