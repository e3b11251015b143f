#!/usr/bin/env bash
# The Python suite as CI runs it: a virtual environment with PyTorch, transformers and pytest,
# cached outside the clone and keyed by the hash of python/requirements-test.txt (so only a changed
# requirements file pays for the install), then `pip install ./python` (maturin builds the
# extension from this clone) and pytest on python/tests. Needs python3 (>= 3.9, with venv), a Rust
# toolchain and PyPI.
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
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps ./python
"$venv/bin/python" -m pytest -q python/tests
