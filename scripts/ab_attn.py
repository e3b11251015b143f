#!/usr/bin/env python3
"""Two (or more) attn binaries on the same `attn bench` arguments, in alternating rounds.

For comparing builds of attn with each other (a change against main) on a noisy shared machine:
each round runs every binary once, in turn, so drifting load hits all alike; a run is
`attn bench ARGS --iters I --warmup W --json` and gives its median seconds per call. The table
shows, per binary over the rounds, the minimum, the lower quartile and the median of those
medians, and each binary's median relative to the first. Nothing but attn runs (no PyTorch).

Setup:  cargo build --release -p attn-cli, and copy target/release/attn aside for each build
Usage:  python scripts/ab_attn.py --bins /tmp/attn-main /tmp/attn-new [--rounds 10] [--iters 3]
        [--warmup 1] -- --shape 1,4,2048,64 --threads 1 [--backward] [...]
"""

import argparse
import json
import statistics
import subprocess
import sys


def run_once(binary, bench_args, iters, warmup):
    """Median seconds per call of one `attn bench` run."""
    cmd = [binary, "bench", *bench_args, "--iters", str(iters), "--warmup", str(warmup), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(rows) != 1:
        sys.exit(f"ab_attn: expected one JSON row from {' '.join(cmd)}, found {len(rows)}")
    return rows[0]["median_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bins", nargs="+", required=True, help="attn binaries, the first the baseline")
    p.add_argument("--rounds", type=int, default=10, help="alternating rounds")
    p.add_argument("--iters", type=int, default=3, help="timed calls per run")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per run")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then the `attn bench` arguments")
    a = p.parse_args()
    bench_args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    if not bench_args:
        p.error("give the `attn bench` arguments after --")
    times = {b: [] for b in a.bins}
    for r in range(a.rounds):
        for b in a.bins:
            times[b].append(run_once(b, bench_args, a.iters, a.warmup))
        print(f"round {r + 1}/{a.rounds}: " + "  ".join(f"{times[b][-1] * 1e3:.2f}" for b in a.bins), file=sys.stderr)
    base = statistics.median(times[a.bins[0]])
    print(f"attn bench {' '.join(bench_args)}: {a.rounds} rounds, ms per call (median of {a.iters} per run)")
    print(f"{'binary':40s} {'min':>9s} {'q1':>9s} {'median':>9s} {'vs first':>9s}")
    for b in a.bins:
        x = sorted(times[b])
        med = statistics.median(x)
        print(f"{b:40s} {x[0] * 1e3:9.2f} {x[len(x) // 4] * 1e3:9.2f} {med * 1e3:9.2f} {med / base:9.3f}")


if __name__ == "__main__":
    main()
