#!/usr/bin/env python3
"""The Rust side of the comparisons with PyTorch (modules_vs_torch.py, train_vs_torch.py): the
options and checks they share, running an example binary for its JSON report under the same
thread count as PyTorch, and profiling it: where its CPU time goes, from `perf record -g`
samples, as the share of samples in each of these classes.

  gemm         candle's matrix products (the `gemm` crates)
  attention    our attention kernels (`attn_kernels::`)
  element-wise candle's element-wise, reduction, copy, index and gather ops and our modules' own
               loops (`candle_core::`, `candle_nn::`, `attn_nn::`, `attn::`, `attn_train::`), the
               iterator code they collect through, libm, memcpy/memmove
  alloc+faults the allocator (malloc, free), zeroing fresh memory (memset, calloc), and the
               kernel serving page faults and mmap/munmap/brk: fresh buffers being mapped and freed
  sync         threads waiting or handing off work: rayon and crossbeam, candle's barrier pool, the
               kernel in futex, sched_yield or the scheduler
  other        the rest (timer interrupts, the loader, the standard library, ...)

A sample in the program is classed by its function's name; a sample in the kernel by why the
kernel runs, read off its kernel stack (which -g always records; the program's own callers need
frame pointers, which release builds lack, so only the sampled function counts). Samples are CPU
time: a thread blocked off-CPU is not counted, a spinning one is (rayon spins before it sleeps).
Symbols come from the binary's debug info (the workspace builds release with `debug = 1`);
kernel symbols need root or `kernel.kptr_restrict=0`.

Alone, it classifies a recording:
    perf record -e cpu-clock -g -o perf.data -- PROGRAM ...
    python scripts/rust_side.py perf.data [--top 15]
Setup: `apt-get install linux-perf` (Debian) or `linux-tools-$(uname -r)` (Ubuntu).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CLASSES = ["gemm", "attention", "element-wise", "alloc+faults", "sync", "other"]

# First match wins: the kernels before rayon (whose generic helpers can hold their inlined loops),
# threads before candle_core (the barrier pool lives there).
RULES = [
    ("gemm", r"\bgemm|gemm_common|gemm_f32|gemm_f64|gemm_f16|nano_gemm"),
    ("attention", r"attn_kernels::"),
    ("sync", r"BarrierPool|barrier_pool|rayon|crossbeam|futex|sched_yield|std::thread::park|"
             r"parking_lot|spin_loop"),
    ("alloc+faults", r"malloc|\bfree\b|_int_free|cfree|calloc|realloc|\bmmap|munmap|memset|"
                     r"__rust_alloc|__rust_dealloc|alloc::alloc|RawVec|unlink_chunk"),
    ("element-wise", r"candle_core::|candle_nn::|attn_nn::|attn::|attn_train::|memcpy|memmove|"
                     r"\bexpf?\b|\blogf?\b|\bsqrtf?\b|tanhf?|__ieee754|libm|half::|from_iter|core::iter::"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in RULES]


def classify(symbol):
    """The class of a demangled user-space symbol name."""
    for name, pattern in COMPILED:
        if pattern.search(symbol):
            return name
    return "other"


# Kernel samples are classed by why the kernel runs, read off their kernel stack.
KERNEL_FAULTS = re.compile(r"exc_page_fault|sys_(munmap|mmap|brk|madvise|mprotect|mremap)\b")
KERNEL_SYNC = re.compile(r"sys_(futex|sched_yield|nanosleep|clock_nanosleep)\b|^schedule$|__schedule")


def classify_stack(frames):
    """The class of one sample from its frames, leaf first, each (is_kernel, symbol)."""
    if not frames:
        return "other"
    if not frames[0][0]:
        return classify(frames[0][1])
    kernel = [sym for is_kernel, sym in frames if is_kernel]
    if any(KERNEL_FAULTS.search(sym) for sym in kernel):
        return "alloc+faults"
    if any(KERNEL_SYNC.search(sym) for sym in kernel):
        return "sync"
    return "other"


def read_samples(perf_data):
    """Per sample, its frames leaf first as (is_kernel, symbol), from `perf script`."""
    cmd = ["perf", "script", "-i", perf_data, "-F", "ip,sym"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    samples, frames = [], []
    for line in done.stdout.splitlines() + [""]:
        m = re.match(r"\s*([0-9a-f]+)\s+(.*\S)", line)
        if m:
            frames.append((m.group(1).startswith("ffffffff"), m.group(2)))
        elif frames:
            samples.append(frames)
            frames = []
    if not samples:
        sys.exit(f"error: {perf_data}: perf script found no samples")
    return samples


def record(cmd, env, perf_data, frequency=499):
    """Runs `cmd` (a list) under `perf record` into `perf_data`; returns its standard output."""
    if shutil.which("perf") is None:
        sys.exit("error: --profile needs perf (apt-get install linux-perf, or linux-tools-$(uname -r))")
    # cpu-clock is a software event: it works in virtual machines without hardware counters; -g
    # records the kernel's stacks (and what frame pointers give of the program's).
    full = ["perf", "record", "-e", "cpu-clock", "-F", str(frequency), "-g", "-o", perf_data, "--", *cmd]
    done = subprocess.run(full, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(full)} failed: {done.stderr.strip()}")
    return done.stdout


def print_split(samples, top):
    """Prints the share of each class, then the `top` heaviest leaf symbols with the class of
    their samples; returns the shares (percent)."""
    shares = dict.fromkeys(CLASSES, 0.0)
    leaves = {}
    for frames in samples:
        c = classify_stack(frames)
        shares[c] += 100.0 / len(samples)
        key = (frames[0][1] if frames else "[none]", c)
        leaves[key] = leaves.get(key, 0) + 100.0 / len(samples)
    print(f"  {len(samples)} samples: " + "  ".join(f"{c} {shares[c]:.1f}%" for c in CLASSES))
    for (symbol, c), percent in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]:
        short = symbol if len(symbol) <= 90 else symbol[:87] + "..."
        print(f"  {percent:6.2f}%  {c:<13} {short}")
    return shares


def add_options(p, bench, threads):
    """The options every comparison has: the binary, threads, candle's pool, profile, JSON."""
    p.add_argument("--bench", default=f"target/release/examples/{bench}", help=f"path to the {bench} example binary")
    p.add_argument("--threads", type=int, default=threads, help=f"threads for both (default {threads})")
    p.add_argument("--candle-threads", type=int, default=1,
                   help="CANDLE_NUM_THREADS of the Rust side (default 1, as the attn binary runs)")
    p.add_argument("--profile", action="store_true", help="then profile the Rust side with perf")
    p.add_argument("--json-out", help="also write the results to this JSON file")


def torch_beside(binary, flag, build, threads):
    """Exits with a one-line error unless `binary` (given as `flag`) is an executable (built by
    `build`) and PyTorch imports; returns PyTorch on `threads` threads."""
    if not os.access(binary, os.X_OK):
        sys.exit(f"error: {flag} {binary} is not an executable ({build})")
    try:
        import torch
    except ImportError:
        sys.exit("error: PyTorch is missing: pip install -r scripts/requirements.txt")
    torch.set_num_threads(threads)
    return torch


def start(a, build):
    """Checks the shared options; returns PyTorch (on `a.threads` threads) and the Rust side's
    environment: RAYON_NUM_THREADS (candle's matrix products, our kernels) and
    CANDLE_NUM_THREADS (candle's element-wise pool)."""
    if a.threads < 1 or a.candle_threads < 1:
        sys.exit("error: --threads and --candle-threads must be >= 1")
    torch = torch_beside(a.bench, "--bench", build, a.threads)
    env = {**os.environ, "RAYON_NUM_THREADS": str(a.threads), "CANDLE_NUM_THREADS": str(a.candle_threads)}
    return torch, env


def median_seconds(call, reps, warmup):
    """Median seconds of `reps` calls of `call` after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_json(cmd, env):
    """The last line of `cmd`'s standard output as JSON; exits naming the command if it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile(cmd, env, title, top=12):
    """Runs `cmd` under perf, prints `title(report)` for its JSON report and the split of its CPU
    time; returns the shares (percent per class)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        report = json.loads(record(cmd, env, data).strip().splitlines()[-1])
        print(f"\n{title(report)}")
        return print_split(read_samples(data), top)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("perf_data", help="a perf.data file recorded with -g")
    p.add_argument("--top", type=int, default=15, help="heaviest symbols listed")
    a = p.parse_args()
    print_split(read_samples(a.perf_data), a.top)


if __name__ == "__main__":
    main()
