#!/usr/bin/env bash
# Every test, as CI runs it (.ci/run calls this): the Rust workspace's tests, the Python suite
# (scripts/ci_python.sh) and the documentation with warnings as errors.
#
# The Python suite's environment (PyTorch and transformers, several GB: minutes of downloading and
# unpacking on a machine without the cache) is prepared in the background while the Rust tests
# build and run, which keep the cores busy, so a fresh machine waits for the longer of the two
# rather than their sum. Its output is shown only if it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
scripts/ci_python.sh --prepare >"$log" 2>&1 &
prepare=$!
# On any exit before it finished (a failing Rust test), stop the preparation and its children.
trap 'if kill -0 "$prepare" 2>/dev/null; then pkill -P "$prepare" || true; kill "$prepare" || true; fi; rm -f "$log"' EXIT
cargo test --workspace
if ! wait "$prepare"; then
  cat "$log" >&2
  echo "scripts/test.sh: preparing the Python environment (scripts/ci_python.sh --prepare) failed" >&2
  exit 1
fi
scripts/ci_python.sh
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps
