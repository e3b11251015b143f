#!/usr/bin/env bash
# The Python suite as CI runs it: a virtual environment with PyTorch, transformers and pytest,
# cached outside the clone and keyed by the hash of python/requirements-test.txt (so only a changed
# requirements file pays for the install); then the extension module as the workspace's test build
# makes it, and pytest on python/tests with the package staged from python/attn and that module.
#
# The extension (python/, a workspace member) is built by `cargo build --workspace --lib --tests`:
# the same dependency features as `cargo test --workspace`, so after scripts/test.sh's Rust tests
# it compiles only pyo3, numpy and the bindings and reuses their attn-kernels (`pip install
# ./python`, a release build with the extension's own features, compiled attn-kernels again: ~9 of
# CI's 30 minutes). maturin's packaging itself is what `pip install ./python` checks by hand.
# Needs python3 (>= 3.9, with venv), a Rust toolchain and PyPI.
#
#   scripts/ci_python.sh                       # cache in ${ATTN_PY_CACHE:-~/.cache/attn-python-ci}
#   ATTN_PY_CACHE=/path scripts/ci_python.sh   # elsewhere
#   scripts/ci_python.sh --prepare             # only the cached environment (scripts/test.sh runs
#                                              # this beside the Rust tests)
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements-test.txt
cache="${ATTN_PY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/attn-python-ci}"
key=$(sha256sum "$req" | cut -c1-16)
venv="$cache/venv-$key"
export PIP_CACHE_DIR="$cache/pip" PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$venv/bin/python" ]; then
  # Built beside and renamed when complete, so an interrupted install is never taken as the cache.
  rm -rf "$venv.partial"
  python3 -m venv "$venv.partial"
  "$venv.partial/bin/python" -m pip install --quiet -r "$req"
  mv "$venv.partial" "$venv"
fi
if [ "${1:-}" = "--prepare" ]; then
  exit 0
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The cdylib's path from cargo's artifact messages (its name differs by platform).
lib=$(cargo build --workspace --lib --tests --message-format=json-render-diagnostics |
  "$venv/bin/python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "_attn":
        print(next(f for f in m["filenames"] if f.endswith((".so", ".dylib"))))')
[ -n "$lib" ] || { echo "scripts/ci_python.sh: cargo built no _attn extension module" >&2; exit 1; }
mkdir "$stage/attn"
cp python/attn/*.py "$stage/attn/"
cp "$lib" "$stage/attn/_attn.abi3.so"
export PYTHONPATH="$stage"
"$venv/bin/python" -c 'import attn, sys; assert attn.__file__.startswith(sys.argv[1]), attn.__file__' "$stage"
"$venv/bin/python" -m pytest -q python/tests
