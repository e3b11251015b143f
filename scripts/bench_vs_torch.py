#!/usr/bin/env python3
"""Compare `attn bench` with PyTorch's CPU scaled_dot_product_attention, shape by shape.

Both run in f32 with the same thread count on random inputs of the same shape. For each shape
the two are timed in alternating rounds (torch, attn, torch, attn, ...) so that drifting machine
load hits both alike; each round reports a median over repeated calls, and the table shows the
median over rounds. GFLOP/s use the rule of `attn bench --help`: 2*Dk + 2*Dv FLOPs per unmasked
(query, key) pair per batch and query head, causal pairs counted exactly (top-left alignment).

Setup:  pip install -r scripts/requirements.txt      (PyTorch, CPU build is enough)
        cargo build --release -p attn-cli
Usage:  python scripts/bench_vs_torch.py --attn target/release/attn [--threads N] [--sparse] [--dtype bf16]
        [--shapes SPEC ...] [--rounds R] [--reps N] [--warmup W] [--json-out results.json]

A shape SPEC is B,H,Lq,D followed by optional ":"-separated options: "causal", "kv=Hkv"
(key/value heads, grouped-query attention), "lk=Lk" (key length, default Lq), "dropout=P"
(with --backward), e.g. "1,32,1,128:kv=8:lk=8192" or "4,16,1024,64:causal".

Block-sparse patterns: "pattern=NAME" with the pattern's parameters as `attn bench` takes them
("window=L,R", "global=G", "random=R", "seed=S", "stride=S", "summary=C", "doc-lengths=a,b,c",
"prefix=P", "sink-tokens=N"), e.g. "1,8,4096,64:pattern=longformer:window=128,128:global=16";
`--sparse` runs the targets of issue 18 (Longformer and BigBird at 1,8,4096,64). attn computes
with the pattern's block mask; PyTorch with the same mask as a dense [Lq, Lk] boolean
`attn_mask`, which is what a PyTorch CPU user does today. The dense mask is the one attn itself
writes (`attn run --weights` on small inputs), so both compute exactly the same pairs; the
Longformer mask is also checked against the paper's definition here. FLOPs count the allowed
pairs. For each pattern shape the peak memory of one call is measured too, each side in a fresh
process: attn's is `attn bench`'s (the allocator's high-water mark beyond the output, one call)
plus the block mask's bytes; PyTorch's is the growth of the resident set's high-water mark over
one call (reset through /proc/self/clear_refs) plus the dense mask's bytes.

With --dtype bf16 (or f16) PyTorch runs on q, k, v of that dtype, the way a bf16 model calls it,
and attn on keys and values of that dtype (`--kv-dtype`) with, for bf16, bfloat16 products
(`--compute bf16`: f32 accumulation, native on AVX512-BF16); attn's f16 has no f16 products and
computes in f32.

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
from sparse_side import attn_peak, check_against_paper, dense_mask, torch_peak

BACKWARD_SHAPES = [
    "1,8,2048,64",
    "1,8,2048,64:causal",
    "1,1,4096,128",
    "1,32,1024,128:kv=8:causal",
    "1,8,1024,64:dropout=0.1",
]

SPARSE_SHAPES = [
    "1,8,4096,64:pattern=longformer:window=128,128:global=16",
    "1,8,4096,64:pattern=bigbird:window=128,128:global=16:random=3:seed=0",
]

# The pattern parameters a SPEC may give, each passed to attn as `--KEY VALUE`.
PATTERN_KEYS = ["window", "global", "random", "seed", "stride", "summary", "doc-lengths", "prefix", "sink-tokens"]

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
        self.pattern, self.pattern_flags, self.mask_pairs = None, [], None
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "pattern" and value:
                self.pattern = value
            elif key in PATTERN_KEYS and value:
                self.pattern_flags += [f"--{key}", value]
            elif key == "causal" and not value:
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
                raise ValueError(f"shape '{spec}': unknown option '{opt}' (causal, kv=N, lk=N, dropout=P, "
                                 f"pattern=NAME, {'=, '.join(PATTERN_KEYS)}=)")
        if min(self.b, self.h, self.lq, self.d, self.hkv, self.lk) < 1 or self.h % self.hkv:
            raise ValueError(f"shape '{spec}': sizes must be >= 1 and H a multiple of the kv heads")
        if self.pattern_flags and not self.pattern:
            raise ValueError(f"shape '{spec}': pattern parameters without pattern=NAME")
        if self.pattern and self.dropout:
            raise ValueError(f"shape '{spec}': dropout=P with a pattern is not compared")

    def pattern_args(self):
        """The pattern's flags of `attn run` and `attn bench`, with --causal."""
        args = ["--pattern", self.pattern, *self.pattern_flags] if self.pattern else []
        return args + (["--causal"] if self.causal else [])

    def flops(self, backward=False):
        """2*Dk + 2*Dv = 4*D FLOPs per unmasked (i, j) pair, per batch and query head; times 3.5
        with the backward."""
        if self.pattern:
            pairs = self.mask_pairs
        elif self.causal:
            pairs = sum(min(i + 1, self.lk) for i in range(self.lq))
        else:
            pairs = self.lq * self.lk
        forward = 4 * self.d * pairs * self.b * self.h
        return forward * 7 // 2 if backward else forward

    def attn_args(self, backward):
        args = ["--shape", f"{self.b},{self.h},{self.lq},{self.d}", "--kv-len", str(self.lk),
                "--kv-heads", str(self.hkv), *self.pattern_args()]
        args += ["--backward"] if backward else []
        return args + (["--dropout", str(self.dropout)] if self.dropout else [])


def torch_call(torch, shape, backward, mask, backend=None, dtype="f32"):
    """A context choosing the backend, one call of torch SDPA on fresh random inputs of `shape`
    (with `backward`: forward plus autograd backward) with `mask` (a boolean [Lq, Lk] tensor,
    True = attend) or none, and the backend: `backend` when given, else flash (tried with one
    call) or math where flash refuses."""
    f = torch.nn.functional.scaled_dot_product_attention
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    q = torch.randn(shape.b, shape.h, shape.lq, shape.d, dtype=dt, requires_grad=backward)
    k = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, dtype=dt, requires_grad=backward)
    v = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, dtype=dt, requires_grad=backward)
    grad = torch.randn(shape.b, shape.h, shape.lq, shape.d, dtype=dt)
    # PyTorch takes a mask or is_causal, not both: a pattern's mask already holds causal.
    kwargs = {"attn_mask": mask} if mask is not None else {"is_causal": shape.causal}
    kwargs["dropout_p"] = shape.dropout
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
    if backend is None:
        backend = "flash"
        try:
            # A refusal (dropout, say) comes with a UserWarning saying why: the math backend is the answer.
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                call()
        except RuntimeError:
            backend = "math"
    chosen = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.MATH
    return (lambda: sdpa_kernel(chosen)), call, backend


def time_torch(torch, shape, reps, warmup, backward, mask=None, dtype="f32"):
    """Median seconds of torch SDPA (see `torch_call`) over `reps` calls after `warmup` calls,
    and the backend that ran."""
    backend_ctx, call, backend = torch_call(torch, shape, backward, mask, dtype=dtype)
    times = []
    with backend_ctx():
        for _ in range(warmup):
            call()
        for _ in range(reps):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    return statistics.median(times), backend


def dtype_args(dtype):
    """`attn bench`'s flags for inputs of `dtype` (see the module's text)."""
    return {"f32": [], "bf16": ["--kv-dtype", "bf16", "--compute", "bf16"], "f16": ["--kv-dtype", "f16"]}[dtype]


def time_attn(binary, shape, threads, reps, warmup, kernel, backward, dtype="f32"):
    """Median seconds of `attn bench` over exactly `reps` calls after `warmup` calls."""
    cmd = [binary, "bench", *shape.attn_args(backward), "--threads", str(threads), "--kernel", kernel,
           "--warmup", str(warmup), "--iters", str(reps), "--budget", "inf", "--json", *dtype_args(dtype)]
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
    p.add_argument("--sparse", action="store_true",
                   help="the block-sparse targets (Longformer, BigBird at 1,8,4096,64) as the default shapes")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                   help="threads for both (default: all this process may use)")
    p.add_argument("--kernel", default="auto", help="attn kernel (default: auto)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"],
                   help="dtype of the inputs (default f32; see the module's text)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape")
    p.add_argument("--reps", type=int, default=5, help="timed calls per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per round")
    p.add_argument("--json-out", help="also write the results to this JSON file")
    a = p.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.reps < 1 or a.warmup < 0:
        sys.exit("error: --threads, --rounds and --reps must be >= 1, --warmup >= 0")
    try:
        defaults = SPARSE_SHAPES if a.sparse else BACKWARD_SHAPES if a.backward else DEFAULT_SHAPES
        shapes = [Shape(s) for s in (a.shapes or defaults)]
        if not a.backward and any(s.dropout for s in shapes):
            raise ValueError("dropout=P needs --backward (the forward comparison is without dropout)")
    except ValueError as e:
        sys.exit(f"error: {e}")
    torch = torch_beside(a.attn, "--attn", "cargo build --release -p attn-cli", a.threads)
    torch.manual_seed(0)

    masks = {}
    for shape in shapes:
        if shape.pattern:
            mask = dense_mask(a.attn, shape)
            check_against_paper(shape, mask)
            shape.mask_pairs = int(mask.sum())
            masks[shape.spec] = mask
    results = []
    width = max([28] + [len(s.spec) + 1 for s in shapes])
    header = (f"{'shape':<{width}} {'torch ms':>10} {'attn ms':>10} {'torch GF/s':>11} {'attn GF/s':>10} "
              f"{'torch/attn':>10}  torch backend")
    print(f"threads={a.threads} kernel={a.kernel} dtype={a.dtype} rounds={a.rounds} reps={a.reps} torch={torch.__version__} "
          f"{'forward+backward' if a.backward else 'forward'}")
    print(header)
    for shape in shapes:
        torch_t, attn_t = [], []
        mask = masks.get(shape.spec)
        torch_mask = torch.from_numpy(mask) if mask is not None else None
        for _ in range(a.rounds):
            t, backend = time_torch(torch, shape, a.reps, a.warmup, a.backward, torch_mask, a.dtype)
            torch_t.append(t)
            attn_t.append(time_attn(a.attn, shape, a.threads, a.reps, a.warmup, a.kernel, a.backward, a.dtype))
        t, s = statistics.median(torch_t), statistics.median(attn_t)
        flops = shape.flops(a.backward)
        r = {"shape": shape.spec, "flops": flops, "threads": a.threads, "kernel": a.kernel, "dtype": a.dtype,
             "backward": a.backward, "torch_backend": backend,
             "torch_ms": t * 1e3, "attn_ms": s * 1e3, "torch_gflops": flops / t / 1e9,
             "attn_gflops": flops / s / 1e9, "ratio": t / s,
             "torch_round_ms": [x * 1e3 for x in torch_t], "attn_round_ms": [x * 1e3 for x in attn_t]}
        if mask is not None:
            extra, mask_bytes = attn_peak(a.attn, shape, a.threads, a.kernel, a.backward)
            r["density"] = shape.mask_pairs / (shape.lq * shape.lk)
            r["attn_peak_bytes"], r["attn_mask_bytes"] = extra, mask_bytes
            r["torch_peak_bytes"] = torch_peak(shape.spec, mask, a.threads, a.backward, backend)
            r["torch_mask_bytes"] = mask.nbytes
        results.append(r)
        print(f"{shape.spec:<{width}} {r['torch_ms']:>10.3f} {r['attn_ms']:>10.3f} {r['torch_gflops']:>11.2f} "
              f"{r['attn_gflops']:>10.2f} {r['ratio']:>10.2f}  {backend}", flush=True)
    sparse = [r for r in results if "torch_peak_bytes" in r]
    if sparse:
        mib = 1 << 20
        print(f"\npeak memory of one call, MiB (attn: beyond its outputs, + block mask; torch: resident "
              f"growth, outputs included, + dense mask)")
        print(f"{'shape':<{width}} {'pairs':>7} {'attn':>9} {'+ mask':>9} {'torch':>9} {'+ mask':>9}")
        for r in sparse:
            print(f"{r['shape']:<{width}} {r['density']:>7.4f} {r['attn_peak_bytes'] / mib:>9.2f} "
                  f"{r['attn_mask_bytes'] / mib:>9.3f} {r['torch_peak_bytes'] / mib:>9.1f} "
                  f"{r['torch_mask_bytes'] / mib:>9.1f}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "kernel": a.kernel, "dtype": a.dtype, "torch": torch.__version__, "backward": a.backward,
                       "rounds": a.rounds, "reps": a.reps, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
