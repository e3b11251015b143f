#!/usr/bin/env bash
# Every test, as CI runs it (.ci/run calls this): the Rust workspace's tests, the Python suite
# (scripts/ci_python.sh) and the documentation with warnings as errors.
#
# Two jobs run in the background, each beside work that leaves a core idle, so a fresh machine
# waits for the longer of each pair rather than their sum; their output is shown only if they fail:
# - the Python suite's environment (PyTorch and transformers, several GB: minutes of downloading
#   and unpacking without the cache), prepared while the Rust tests build and run;
# - the documentation (`cargo doc`, its own target directory, as it shares no compiled unit with
#   the tests), built while the Rust tests run, once they are compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
pids=()
# On any exit before they finished (a failing test), stop the background jobs and their children.
trap 'for p in "${pids[@]}"; do if kill -0 "$p" 2>/dev/null; then pkill -P "$p" || true; kill "$p" || true; fi; done; rm -rf "$logs"' EXIT
scripts/ci_python.sh --prepare >"$logs/prepare" 2>&1 &
prepare=$!
pids+=("$prepare")
cargo test --workspace --no-run
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --target-dir target/rustdoc >"$logs/doc" 2>&1 &
doc=$!
pids+=("$doc")
cargo test --workspace
# Waits for background job `$1`; on failure shows its log `$2` and names what failed (`$3`).
finish() {
  if ! wait "$1"; then
    cat "$2" >&2
    echo "scripts/test.sh: $3 failed" >&2
    exit 1
  fi
}
finish "$prepare" "$logs/prepare" "preparing the Python environment (scripts/ci_python.sh --prepare)"
scripts/ci_python.sh
finish "$doc" "$logs/doc" "the documentation (cargo doc with warnings as errors)"
