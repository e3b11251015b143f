#!/usr/bin/env python3
"""Compare `attn bench --linear` with the same linear-attention algorithm written in PyTorch ops.

PyTorch side: elu(x)+1 features, then non-causal `S = φ(K)ᵀV`, `z = Σ φ(k)`, `out = φ(Q)S / (φ(Q)z + ε)`,
or causal in chunks of 64 rows: inside a chunk the masked product `tril(φ(Q_c)φ(K_c)ᵀ)V_c`, across
chunks the running state (the chunk states as one cumulative sum, the way fla/flash-linear-attention
writes the chunked form in plain PyTorch), batched over (batch, head) with einsum/matmul. With
--backward each call is a forward plus autograd's backward for a fixed output gradient; attn's is
`attn bench --linear elu --backward` (its fused backward kernel). Both in f32 with the same thread
count, timed in alternating rounds (torch, attn, torch, attn, ...), each round a median over
repeated calls; the table shows the median over rounds. The two results are checked against each
other first (attn run --linear on the same inputs).

Setup:  pip install -r scripts/requirements.txt; cargo build --release -p attn-cli
Usage:  python scripts/linear_vs_torch.py --attn target/release/attn [--threads 2] [--rounds 5]
        [--shapes B,H,L,D[:causal] ...] [--reps N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHUNK = 64
EPS = 1e-6
DEFAULT_SHAPES = ["1,8,4096,64", "1,8,4096,64:causal", "1,8,16384,64:causal"]


def phi(torch, x):
    return torch.nn.functional.elu(x) + 1.0


def linear_torch(torch, q, k, v, causal):
    """The chunked algorithm in PyTorch ops: q, k [B, H, L, D], v [B, H, L, Dv]."""
    fq, fk = phi(torch, q), phi(torch, k)
    if not causal:
        s = fk.transpose(-1, -2) @ v
        z = fk.sum(-2)
        return (fq @ s) / ((fq * z.unsqueeze(-2)).sum(-1, keepdim=True) + EPS)
    b, h, l, d = q.shape
    n = (l + CHUNK - 1) // CHUNK
    pad = n * CHUNK - l
    if pad:
        fq, fk, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (fq, fk, v))
    fq, fk, v = (x.reshape(b, h, n, CHUNK, x.shape[-1]) for x in (fq, fk, v))
    # Per-chunk states φ(K_c)ᵀV_c and Σφ(K_c); the state before chunk c is the exclusive prefix sum.
    kv = fk.transpose(-1, -2) @ v
    ks = fk.sum(-2)
    s_before = kv.cumsum(2) - kv
    z_before = ks.cumsum(2) - ks
    mask = torch.ones(CHUNK, CHUNK, dtype=torch.bool).tril()
    p = (fq @ fk.transpose(-1, -2)).masked_fill(~mask, 0.0)
    num = fq @ s_before + p @ v
    den = (fq * z_before.unsqueeze(-2)).sum(-1, keepdim=True) + p.sum(-1, keepdim=True) + EPS
    out = (num / den).reshape(b, h, n * CHUNK, v.shape[-1])
    return out[:, :, :l]


class Shape:
    def __init__(self, spec):
        self.spec = spec
        dims, *opts = spec.split(":")
        self.b, self.h, self.l, self.d = (int(x) for x in dims.split(","))
        self.causal = "causal" in opts

    def attn_args(self, backward):
        args = ["--shape", f"{self.b},{self.h},{self.l},{self.d}", "--linear", "elu"]
        return args + (["--causal"] if self.causal else []) + (["--backward"] if backward else [])


def time_torch(torch, shape, reps, warmup, backward):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(shape.b, shape.h, shape.l, shape.d, generator=g) * 2 - 1 for _ in range(3))
    grad = torch.rand(shape.b, shape.h, shape.l, shape.d, generator=g) * 2 - 1
    for x in (q, k, v):
        x.requires_grad_(backward)

    def call():
        if not backward:
            with torch.inference_mode():
                linear_torch(torch, q, k, v, shape.causal)
            return
        linear_torch(torch, q, k, v, shape.causal).backward(grad)
        q.grad = k.grad = v.grad = None

    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_attn(binary, shape, threads, reps, warmup, backward):
    cmd = [binary, "bench", *shape.attn_args(backward), "--threads", str(threads), "--warmup", str(warmup),
           "--iters", str(reps), "--budget", "inf", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return row["median_s"], row["gflops"]


def check_agreement(torch, binary, causal):
    """attn run --linear elu on small random inputs against the PyTorch algorithm in f64."""
    from safetensors.torch import load_file, save_file
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.rand(1, 2, 200, 16, generator=g) * 2 - 1 for _ in range(3))
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"q": q, "k": k, "v": v}, inp)
        cmd = [binary, "run", inp, "--linear", "elu", "-o", out] + (["--causal"] if causal else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
        got = load_file(out)["out"].double()
    want = linear_torch(torch, q.double(), k.double(), v.double(), causal)
    err = (got - want).abs().max().item()
    if err > 1e-4:
        sys.exit(f"error: attn and the PyTorch algorithm differ by {err} (causal {causal})")
    return err


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attn", default="target/release/attn")
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, metavar="B,H,L,D[:causal]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    torch.set_num_threads(a.threads)
    errs = [check_agreement(torch, a.attn, c) for c in (False, True)]
    print(f"torch {torch.__version__}, {a.threads} threads; attn vs PyTorch f64 max |diff| "
          f"{errs[0]:.1e} (full), {errs[1]:.1e} (causal)")
    print(f"{'shape':<22} {'pass':<8} {'torch ms':>10} {'attn ms':>10} {'speed-up':>9} {'attn GFLOP/s':>13}")
    for spec in a.shapes:
        shape = Shape(spec)
        for backward in (False, True):
            t, r, gf = [], [], []
            for _ in range(a.rounds):
                t.append(time_torch(torch, shape, a.reps, a.warmup, backward))
                s, g = time_attn(a.attn, shape, a.threads, a.reps, a.warmup, backward)
                r.append(s)
                gf.append(g)
            tm, rm = statistics.median(t), statistics.median(r)
            print(f"{spec:<22} {'fwd+bwd' if backward else 'fwd':<8} {tm * 1e3:>10.2f} {rm * 1e3:>10.2f} "
                  f"{tm / rm:>8.2f}x {statistics.median(gf):>13.1f}", flush=True)


if __name__ == "__main__":
    main()
