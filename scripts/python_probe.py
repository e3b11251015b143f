#!/usr/bin/env python3
"""Two probes behind the Python figures in README.md (attn's `python/` package beside PyTorch):

  spin    CPU time PyTorch's process burns while its Python thread sleeps 50 ms after one
          `torch.mm` (512×512, --threads threads): its OpenMP workers' spin-wait, which competes
          with attn's threads for the cores. Set OMP_WAIT_POLICY / GOMP_SPINCOUNT in the
          environment to compare (libgomp reads them when PyTorch loads).
  faults  minor page faults per forward + backward (autograd) of attn from Python, against the
          `attn bench --backward` binary's per call, at one shape (default the grouped-query
          gradient shape 1,32,1024,128 with 8 key/value heads, causal).

Setup:  pip install -r scripts/requirements.txt && pip install ./python; cargo build --release -p attn-cli
Usage:  python scripts/python_probe.py spin [--threads 2]
        python scripts/python_probe.py faults --attn target/release/attn [--threads 2]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def spin(a, torch):
    x = torch.randn(512, 512)
    burnt = []
    for _ in range(20):
        torch.mm(x, x)
        c0 = time.process_time()
        time.sleep(0.05)
        burnt.append(time.process_time() - c0)
    policy = os.environ.get("OMP_WAIT_POLICY", "(unset)")
    print(f"OMP_WAIT_POLICY={policy} GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', '(unset)')}: CPU ms burnt "
          f"in the 50 ms after a torch.mm: median {statistics.median(burnt) * 1e3:.1f}, "
          f"min {min(burnt) * 1e3:.1f}, max {max(burnt) * 1e3:.1f}")


def faults(a, torch):
    import attn

    q = torch.randn(1, 32, 1024, 128, requires_grad=True)
    k, v = (torch.randn(1, 8, 1024, 128, requires_grad=True) for _ in range(2))
    grad = torch.randn(1, 32, 1024, 128)

    def step():
        attn.sdpa(q, k, v, is_causal=True, enable_gqa=True).backward(grad)
        q.grad = k.grad = v.grad = None

    step()
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    py = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5

    def bench(iters):
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
        subprocess.run([a.attn, "bench", "--shape", "1,32,1024,128", "--kv-heads", "8", "--causal", "--backward",
                        "--threads", str(a.threads), "--iters", str(iters), "--warmup", "0", "--budget", "inf",
                        "--json"], capture_output=True, check=True)
        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before

    binary = (bench(11) - bench(1)) / 10
    print(f"minor page faults per forward + backward at 1,32,1024,128 kv 8 causal: attn from Python {py:.0f}, "
          f"attn bench {binary:.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("probe", choices=["spin", "faults"])
    p.add_argument("--threads", type=int, default=2, help="threads for PyTorch and attn (default 2)")
    p.add_argument("--attn", default="target/release/attn", help="the attn binary (faults)")
    a = p.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    try:
        import torch
    except ImportError as e:
        sys.exit(f"error: {e} (pip install -r scripts/requirements.txt)")
    torch.set_num_threads(a.threads)
    (spin if a.probe == "spin" else faults)(a, torch)


if __name__ == "__main__":
    main()
