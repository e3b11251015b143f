#!/usr/bin/env python3
"""The per-call cost of a small differentiable attention call: forward + backward at
``B,H,L,D`` = 1,2,16,16 (the size of PyTorch's own SDPA tests) through ``attn.sdpa``, through
``F.scaled_dot_product_attention`` under ``attn.torch.patch()``, and PyTorch's own, in one
process, on the same threads, alternating round by round (issue 46: within 30 µs of PyTorch's).
Also the forward alone without a gradient, and the native call (``attn._attn.forward`` and
``backward``) beside them, so that what the Python layer adds can be read off.

Setup:  scripts/ci_python.sh --prepare (or pip install torch), and the package staged or installed
        (pip install ./python)
Usage:  python scripts/small_calls_vs_torch.py [--shape 1,2,16,16] [--threads 2] [--rounds 7]
        [--calls 2000]
Prints medians over rounds of the mean time per call, in µs, and attn − PyTorch.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attn
import attn.torch
from attn import _ops


def per_call(fn, calls):
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1,2,16,16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    b, h, l, d = (int(x) for x in a.shape.split(","))
    torch.set_num_threads(a.threads)
    attn.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, l, d, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, l, d, generator=g)
    qn, kn, vn = (t.detach() for t in (q, k, v))

    def step(f):
        return lambda: torch.autograd.backward(f(q, k, v), grad)

    opts = _ops.native_options(None, 0.0, False, None, None, None, False, None, 0, "f32")
    out, lse, res, _ = (torch.from_numpy(x) if x is not None else None for x in _ops.run_forward(qn, kn, vn, opts, False))

    def native():
        from torch.utils.dlpack import to_dlpack

        o, ls, rs, _ = _ops.run_forward(qn, kn, vn, opts, False)
        _ops._attn.backward(
            to_dlpack(qn), to_dlpack(kn), to_dlpack(vn), to_dlpack(out), to_dlpack(grad), to_dlpack(lse),
            to_dlpack(res), opts, False,
        )

    cases = {
        "torch fwd+bwd": step(F.scaled_dot_product_attention),
        "attn.sdpa fwd+bwd": step(attn.sdpa),
        # What F.scaled_dot_product_attention is under attn.torch.patch().
        "patched fwd+bwd": step(attn.torch._routed),
        "native fwd+bwd": native,
        "torch fwd (no grad)": lambda: F.scaled_dot_product_attention(qn, kn, vn),
        "attn.sdpa fwd (no grad)": lambda: attn.sdpa(qn, kn, vn),
    }
    times = {name: [] for name in cases}
    for _ in range(a.rounds):
        for name, fn in cases.items():
            times[name].append(per_call(fn, a.calls))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"shape {a.shape}, {a.threads} threads, {a.rounds} rounds of {a.calls} calls (µs per call, median)")
    for name, us in med.items():
        base = med["torch fwd+bwd"] if "bwd" in name else med["torch fwd (no grad)"]
        print(f"  {name:26s} {us:8.1f}   vs torch {us - base:+7.1f}")


if __name__ == "__main__":
    main()
