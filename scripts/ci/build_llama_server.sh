#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama-cpp-python sdist (which vendors llama.cpp),
# cached by version. Prints the binary's path on the last line of stdout on success.
# Usage: scripts/ci/build_llama_server.sh [CACHE_DIR]
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${1:-${PERFSCOPE_CI_CACHE:-$HOME/.cache/perfscope-ci}}"
DEST="$CACHE/llama-server-$VERSION"
BIN="$DEST/bin/llama-server"
JOBS="${PERFSCOPE_CI_JOBS:-2}"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "llama-server $VERSION: cached" >&2
    echo "$BIN"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake missing" >&2; exit 1; }
command -v c++ >/dev/null || { echo "c++ compiler missing" >&2; exit 1; }
# The build folder is kept when a build is cut short (CI step timeout): the next run resumes it.
WORK="$CACHE/build-llama-$VERSION"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
mkdir -p "$WORK"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    rm -rf "${WORK:?}"/*
    PY="${PYTHON:-python3}"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$WORK" "llama-cpp-python==$VERSION" >&2
    tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
    rm -f "$WORK"/llama_cpp_python-"$VERSION".tar.gz
fi
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$JOBS" >&2
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
rm -rf "$WORK"
"$BIN" --version >&2
echo "$BIN"
