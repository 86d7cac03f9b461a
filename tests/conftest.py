"""Shared fixtures: every test gets its own runs and cache folders."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent

# A shell that starts pytest in the background (``nohup ... &``) passes SIGINT on ignored,
# and an ignored signal stays ignored across exec: every CLI a test starts would then shrug
# off the Ctrl-C the signal tests send it. A handled signal is reset to the default at exec,
# so handling it here gives each child the default a terminal user's process has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _session_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same folders for session- and module-scoped fixtures, which are set up before any
    function fixture: without this, a CLI they start would calibrate into the user's home."""
    base = tmp_path_factory.getbasetemp()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFSCOPE_RUNS_DIR", str(base / "session-runs"))
        mp.setenv("PERFSCOPE_CACHE_DIR", str(base / "cache"))
        yield


@pytest.fixture(autouse=True)
def _isolated_dirs(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Calibration results are per machine: the cache stays the session's (_session_dirs),
    # so the CPU calibration runs once, and never in the user's home.
    monkeypatch.setenv("PERFSCOPE_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


@pytest.fixture
def engines_on_path(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make tests/data/engines importable (for python: engines)."""
    path = DATA / "engines"
    monkeypatch.syspath_prepend(str(path))
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for running the CLI in a subprocess with test engines importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(DATA / "engines"), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "160"
    env["NO_COLOR"] = "1"
    env.update(extra)
    return env


PERFSCOPE = [sys.executable, "-m", "perfscope"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 2-layer Llama saved as a Hugging Face folder (``hf:`` engine tests)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path
