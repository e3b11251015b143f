#!/usr/bin/env python3
"""Packed variable-length sequences against padding: attn's packed call against attn's own padded
call and PyTorch SDPA on the padded batch, forward or forward + backward.

The workload (issue 18, Performance): N sequences (default 16) with lengths drawn uniformly from
[--min-len, --max-len] (default 64..1024) by Python's random.Random(--seed), H heads (8) of D
dimensions (64), causal within each sequence, f32. Three ways compute it:
  attn packed   `attn bench --seq-lens L1,...,LN`: q, k, v [sum L, H, D] cut by cu_seqlens
                (attn::sdpa_varlen; with --backward the packed kernels directly), no padding;
  attn padded   the same with --padded: the batch [N, H, max-len, D] with the lengths as key
                lengths (queries past a sequence's length still attend to its keys);
  torch padded  scaled_dot_product_attention on the padded batch with a boolean attn_mask
                [N, 1, max-len, max-len] (causal and key padding; the backend torch picks), with
                --backward autograd's backward for a random output gradient.
As in bench_vs_torch.py: the same thread count for both (default 2), rounds alternating
(torch, attn packed, attn padded, torch, ...) so drifting machine load hits all alike, each round
the median of --reps calls after --warmup calls, the table the median over rounds. Rates are
GFLOP/s of useful work, the same FLOPs for the three: 4*D per (query, key) pair inside a
sequence's causal band, times 3.5 with --backward. The speed-ups are given as ratios of the
medians (as bench_vs_torch.py) and as medians of each round's own ratios, the steadier of the two
when the load drifts between rounds. The pair ratio padded/packed printed first is
the most attn's padded call can lose to packing (it computes a sequence's causal triangle plus
every padded query against the sequence's keys).

Setup:  pip install -r scripts/requirements.txt; cargo build --release -p attn-cli
Usage:  python scripts/bench_varlen.py [--attn target/release/attn] [--backward] [--threads 2]
        [--rounds 5] [--reps 3] [--warmup 1] [--seed 0] [--json-out FILE]
"""

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time

from rust_side import torch_beside


def lengths(a):
    rng = random.Random(a.seed)
    return [rng.randint(a.min_len, a.max_len) for _ in range(a.n)]


def useful_pairs(lens):
    return sum(l * (l + 1) // 2 for l in lens)


def padded_pairs(lens, max_len):
    """Pairs attn's padded call computes: the causal triangle of each sequence plus each padded
    query (causal, top-left: it sees every key of the sequence) against the sequence's keys."""
    return useful_pairs(lens) + sum(l * (max_len - l) for l in lens)


def time_torch(torch, a, lens, backward):
    """Median seconds of torch SDPA on the padded batch with a boolean mask, and the backend."""
    n, h, L, d = a.n, a.heads, a.max_len, a.dim
    q = torch.randn(n, h, L, d, requires_grad=backward)
    k = torch.randn(n, h, L, d, requires_grad=backward)
    v = torch.randn(n, h, L, d, requires_grad=backward)
    grad = torch.randn(n, h, L, d)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    keys = torch.arange(L)[None, :] < torch.tensor(lens)[:, None]
    mask = (causal[None] & keys[:, None, :])[:, None]
    f = torch.nn.functional.scaled_dot_product_attention

    def call():
        if not backward:
            with torch.inference_mode():
                f(q, k, v, attn_mask=mask)
            return
        f(q, k, v, attn_mask=mask).backward(grad)
        q.grad = k.grad = v.grad = None

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = "flash"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            call()
    except RuntimeError:
        backend = "default"
    times = []
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if backend == "flash" else contextlib.nullcontext():
        for _ in range(a.warmup):
            call()
        for _ in range(a.reps):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return statistics.median(times), backend


def time_attn(a, lens, padded, backward):
    """Median seconds of `attn bench --seq-lens` (packed, or with `padded` the padded call)."""
    cmd = [a.attn, "bench", "--shape", f"{a.n},{a.heads},{a.max_len},{a.dim}", "--causal",
           "--seq-lens", ",".join(map(str, lens)), "--threads", str(a.threads), "--warmup", str(a.warmup),
           "--iters", str(a.reps), "--budget", "inf", "--json"]
    cmd += ["--padded"] if padded else []
    cmd += ["--backward"] if backward else []
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    want = flops(a, lens, backward)
    if row["flops"] != want:
        sys.exit(f"error: attn counts {row['flops']} FLOPs, this script {want}")
    return row["median_s"], row["kernel_resolved"]


def flops(a, lens, backward):
    forward = 4 * a.dim * a.heads * useful_pairs(lens)
    return forward * 7 // 2 if backward else forward


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attn", default="target/release/attn", help="path to the attn binary")
    p.add_argument("--backward", action="store_true", help="time forward plus backward")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--n", type=int, default=16, help="sequences (default 16)")
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=1024, help="also the padded length")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    p.add_argument("--reps", type=int, default=3, help="timed calls per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per round")
    p.add_argument("--json-out", help="also write the results to this JSON file")
    a = p.parse_args()
    if min(a.threads, a.rounds, a.reps, a.n, a.min_len, a.heads, a.dim) < 1 or a.warmup < 0 or a.max_len < a.min_len:
        sys.exit("error: sizes, --threads, --rounds and --reps must be >= 1, --warmup >= 0, --max-len >= --min-len")
    torch = torch_beside(a.attn, "--attn", "cargo build --release -p attn-cli", a.threads)
    torch.manual_seed(0)
    lens = lengths(a)
    pair_ratio = padded_pairs(lens, a.max_len) / useful_pairs(lens)
    print(f"threads={a.threads} rounds={a.rounds} reps={a.reps} torch={torch.__version__} "
          f"{'forward+backward' if a.backward else 'forward'}")
    print(f"lengths (seed {a.seed}): {lens}, {sum(lens)} tokens; pairs padded/packed {pair_ratio:.2f}, "
          f"full padded batch/packed {a.n * a.max_len * a.max_len / useful_pairs(lens):.2f}")
    rounds = {"torch padded": [], "attn packed": [], "attn padded": []}
    for _ in range(a.rounds):
        t, backend = time_torch(torch, a, lens, a.backward)
        rounds["torch padded"].append(t)
        t, kernel = time_attn(a, lens, False, a.backward)
        rounds["attn packed"].append(t)
        rounds["attn padded"].append(time_attn(a, lens, True, a.backward)[0])
    f = flops(a, lens, a.backward)
    med = {name: statistics.median(ts) for name, ts in rounds.items()}
    print(f"{'':<14} {'median ms':>10} {'GFLOP/s':>8}  rounds ms")
    for name, ts in rounds.items():
        print(f"{name:<14} {med[name] * 1e3:>10.1f} {f / med[name] / 1e9:>8.1f}  "
              + " ".join(f"{x * 1e3:.1f}" for x in ts))
    # Within a round the three ran seconds apart; the median of the rounds' own ratios is the
    # steadier figure when the machine's load drifts.
    per_round = {other: statistics.median(o / p for o, p in zip(rounds[other], rounds["attn packed"]))
                 for other in ("attn padded", "torch padded")}
    print(f"packed speed-up: {med['attn padded'] / med['attn packed']:.2f}x over attn padded, "
          f"{med['torch padded'] / med['attn packed']:.2f}x over torch padded (ratios of the medians); "
          f"{per_round['attn padded']:.2f}x and {per_round['torch padded']:.2f}x (medians of the rounds' ratios) "
          f"(torch backend {backend}, attn kernel {kernel})")
    if a.json_out:
        with open(a.json_out, "w") as out:
            json.dump({"threads": a.threads, "torch": torch.__version__, "backward": a.backward, "lengths": lens,
                       "seed": a.seed, "rounds": a.rounds, "reps": a.reps, "flops": f, "pair_ratio": pair_ratio,
                       "torch_backend": backend, "attn_kernel": kernel,
                       "median_ms": {n: m * 1e3 for n, m in med.items()},
                       "median_round_ratio": per_round,
                       "round_ms": {n: [x * 1e3 for x in ts] for n, ts in rounds.items()}}, out, indent=2)


if __name__ == "__main__":
    main()
