#!/usr/bin/env python3
"""Compare `attn bench` with PyTorch's CPU scaled_dot_product_attention, shape by shape.

Both run in f32 with the same thread count on random inputs of the same shape. For each shape
the two are timed in alternating rounds (torch, attn, torch, attn, ...) so that drifting machine
load hits both alike; each round reports a median over repeated calls, and the table shows the
median over rounds. GFLOP/s use the rule of `attn bench --help`: 2*Dk + 2*Dv FLOPs per unmasked
(query, key) pair per batch and query head, causal pairs counted exactly (top-left alignment).

Setup:  pip install -r scripts/requirements.txt      (PyTorch, CPU build is enough)
        cargo build --release -p attn-cli
Usage:  python scripts/bench_vs_torch.py --attn target/release/attn [--threads N]
        [--shapes SPEC ...] [--rounds R] [--reps N] [--warmup W] [--json-out results.json]

A shape SPEC is B,H,Lq,D followed by optional ":"-separated options: "causal", "kv=Hkv"
(key/value heads, grouped-query attention), "lk=Lk" (key length, default Lq), "dropout=P"
(with --backward), e.g. "1,32,1,128:kv=8:lk=8192" or "4,16,1024,64:causal".

With --backward each call is a forward (with log-sum-exp) plus a backward: for attn,
`attn bench --backward`; for PyTorch, autograd through scaled_dot_product_attention with the
flash backend, falling back to the math backend where flash refuses (dropout). FLOPs count the
backward as 2.5x the forward (FlashAttention's convention), 3.5x in all. Default shapes then are
the gradient targets.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

from rust_side import torch_beside

BACKWARD_SHAPES = [
    "1,8,2048,64",
    "1,8,2048,64:causal",
    "1,1,4096,128",
    "1,32,1024,128:kv=8:causal",
    "1,8,1024,64:dropout=0.1",
]

DEFAULT_SHAPES = [
    "1,8,2048,64",
    "1,8,4096,128",
    "1,8,2048,64:causal",
    "4,16,1024,64:causal",
    "1,32,1,128:kv=8:lk=8192",
    "1,32,1,128:lk=32768",
]


class Shape:
    """q: [b, h, lq, d], k and v: [b, hkv, lk, d]."""

    def __init__(self, spec):
        self.spec = spec
        head, *opts = spec.split(":")
        try:
            self.b, self.h, self.lq, self.d = (int(x) for x in head.split(","))
        except ValueError:
            raise ValueError(f"shape '{spec}': expected B,H,Lq,D[:causal][:kv=Hkv][:lk=Lk]") from None
        self.hkv, self.lk, self.causal, self.dropout = self.h, self.lq, False, 0.0
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "causal" and not value:
                self.causal = True
            elif key == "kv" and value.isdigit():
                self.hkv = int(value)
            elif key == "lk" and value.isdigit():
                self.lk = int(value)
            elif key == "dropout":
                try:
                    self.dropout = float(value)
                except ValueError:
                    raise ValueError(f"shape '{spec}': dropout={value} is not a number") from None
                if not 0.0 <= self.dropout < 1.0:
                    raise ValueError(f"shape '{spec}': dropout={value} is outside [0, 1)")
            else:
                raise ValueError(f"shape '{spec}': unknown option '{opt}' (causal, kv=N, lk=N, dropout=P)")
        if min(self.b, self.h, self.lq, self.d, self.hkv, self.lk) < 1 or self.h % self.hkv:
            raise ValueError(f"shape '{spec}': sizes must be >= 1 and H a multiple of the kv heads")

    def flops(self, backward=False):
        """2*Dk + 2*Dv = 4*D FLOPs per unmasked (i, j) pair, per batch and query head; times 3.5
        with the backward."""
        if self.causal:
            pairs = sum(min(i + 1, self.lk) for i in range(self.lq))
        else:
            pairs = self.lq * self.lk
        forward = 4 * self.d * pairs * self.b * self.h
        return forward * 7 // 2 if backward else forward

    def attn_args(self, backward):
        args = ["--shape", f"{self.b},{self.h},{self.lq},{self.d}", "--kv-len", str(self.lk),
                "--kv-heads", str(self.hkv)]
        args += ["--causal"] if self.causal else []
        args += ["--backward"] if backward else []
        return args + (["--dropout", str(self.dropout)] if self.dropout else [])


def time_torch(torch, shape, reps, warmup, backward):
    """Median seconds of torch SDPA (with `backward`: forward plus autograd backward) over `reps`
    calls after `warmup` calls, and the backend that ran."""
    f = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(shape.b, shape.h, shape.lq, shape.d, dtype=torch.float32, requires_grad=backward)
    k = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, dtype=torch.float32, requires_grad=backward)
    v = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, dtype=torch.float32, requires_grad=backward)
    grad = torch.randn(shape.b, shape.h, shape.lq, shape.d, dtype=torch.float32)
    kwargs = {"is_causal": shape.causal, "dropout_p": shape.dropout}
    if shape.hkv != shape.h:
        kwargs["enable_gqa"] = True

    def call():
        if not backward:
            with torch.inference_mode():
                f(q, k, v, **kwargs)
            return
        f(q, k, v, **kwargs).backward(grad)
        q.grad = k.grad = v.grad = None

    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = "flash"
    try:
        # A refusal (dropout, say) comes with a UserWarning saying why: the math backend is the answer.
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            call()
    except RuntimeError:
        backend = "math"
    times = []
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.MATH):
        for _ in range(warmup):
            call()
        for _ in range(reps):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return statistics.median(times), backend


def time_attn(binary, shape, threads, reps, warmup, kernel, backward):
    """Median seconds of `attn bench` over exactly `reps` calls after `warmup` calls."""
    cmd = [binary, "bench", *shape.attn_args(backward), "--threads", str(threads), "--kernel", kernel,
           "--warmup", str(warmup), "--iters", str(reps), "--budget", "inf", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if row["flops"] != shape.flops(backward):
        sys.exit(f"error: attn counts {row['flops']} FLOPs for {shape.spec}, this script {shape.flops(backward)}")
    return row["median_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attn", default="target/release/attn", help="path to the attn binary")
    p.add_argument("--shapes", nargs="+", metavar="SPEC",
                   help="B,H,Lq,D[:causal][:kv=Hkv][:lk=Lk][:dropout=P] (default: the target shapes)")
    p.add_argument("--backward", action="store_true", help="time forward plus backward")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                   help="threads for both (default: all this process may use)")
    p.add_argument("--kernel", default="auto", help="attn kernel (default: auto)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape")
    p.add_argument("--reps", type=int, default=5, help="timed calls per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per round")
    p.add_argument("--json-out", help="also write the results to this JSON file")
    a = p.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.reps < 1 or a.warmup < 0:
        sys.exit("error: --threads, --rounds and --reps must be >= 1, --warmup >= 0")
    try:
        shapes = [Shape(s) for s in (a.shapes or (BACKWARD_SHAPES if a.backward else DEFAULT_SHAPES))]
        if not a.backward and any(s.dropout for s in shapes):
            raise ValueError("dropout=P needs --backward (the forward comparison is without dropout)")
    except ValueError as e:
        sys.exit(f"error: {e}")
    torch = torch_beside(a.attn, "--attn", "cargo build --release -p attn-cli", a.threads)
    torch.manual_seed(0)

    results = []
    header = (f"{'shape':<28} {'torch ms':>10} {'attn ms':>10} {'torch GF/s':>11} {'attn GF/s':>10} "
              f"{'torch/attn':>10}  torch backend")
    print(f"threads={a.threads} kernel={a.kernel} rounds={a.rounds} reps={a.reps} torch={torch.__version__} "
          f"{'forward+backward' if a.backward else 'forward'}")
    print(header)
    for shape in shapes:
        torch_t, attn_t = [], []
        for _ in range(a.rounds):
            t, backend = time_torch(torch, shape, a.reps, a.warmup, a.backward)
            torch_t.append(t)
            attn_t.append(time_attn(a.attn, shape, a.threads, a.reps, a.warmup, a.kernel, a.backward))
        t, s = statistics.median(torch_t), statistics.median(attn_t)
        flops = shape.flops(a.backward)
        r = {"shape": shape.spec, "flops": flops, "threads": a.threads, "kernel": a.kernel,
             "backward": a.backward, "torch_backend": backend,
             "torch_ms": t * 1e3, "attn_ms": s * 1e3, "torch_gflops": flops / t / 1e9,
             "attn_gflops": flops / s / 1e9, "ratio": t / s,
             "torch_round_ms": [x * 1e3 for x in torch_t], "attn_round_ms": [x * 1e3 for x in attn_t]}
        results.append(r)
        print(f"{shape.spec:<28} {r['torch_ms']:>10.3f} {r['attn_ms']:>10.3f} {r['torch_gflops']:>11.2f} "
              f"{r['attn_gflops']:>10.2f} {r['ratio']:>10.2f}  {backend}", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "kernel": a.kernel, "torch": torch.__version__, "backward": a.backward,
                       "rounds": a.rounds, "reps": a.reps, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
