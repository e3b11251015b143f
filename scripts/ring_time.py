#!/usr/bin/env python3
"""Time of ring (context-parallel) attention, forward + backward, and the bytes each rank sends,
with W processes over torch.distributed gloo on loopback (attn.ring, `python/`), beside one
process computing the whole sequence with attn.sdpa. Each rank runs its kernels on one thread.

Usage:  python scripts/ring_time.py [--world 2 4] [--shape 1,8,4096,64] [--causal] [--reps 3]
Setup:  pip install -r scripts/requirements.txt && pip install ./python
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp


def inputs(b, h, seq, d):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, seq, d, generator=g) for _ in range(4)]  # q, k, v, grad


def step(fn, q, k, v, grad, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fn(q, k, v, is_causal=causal).backward(grad)


def worker(rank, world, port, shape, causal, reps, results):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from attn.ring import ring_sdpa, stats

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    q, k, v, grad = (t.chunk(world, dim=2)[rank].contiguous() for t in inputs(*shape))
    step(ring_sdpa, q, k, v, grad, causal)
    dist.barrier()
    sent, times = stats()["bytes"], []
    for _ in range(reps):
        start = time.perf_counter()
        step(ring_sdpa, q, k, v, grad, causal)
        times.append(time.perf_counter() - start)
    results.put((rank, statistics.median(times), (stats()["bytes"] - sent) // reps))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, nargs="+", default=[2, 4])
    p.add_argument("--shape", default="1,8,4096,64", help="B,H,L,D of the whole sequence")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import attn

    q, k, v, grad = inputs(*shape)
    step(attn.sdpa, q, k, v, grad, a.causal)
    single = []
    for _ in range(a.reps):
        start = time.perf_counter()
        step(attn.sdpa, q, k, v, grad, a.causal)
        single.append(time.perf_counter() - start)
    print(f"shape {a.shape} {'causal' if a.causal else 'full'}, forward + backward, one thread per process")
    print(f"single process: {statistics.median(single) * 1e3:.1f} ms")
    ctx = mp.get_context("spawn")
    for world in a.world:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        results = ctx.Queue()
        procs = [ctx.Process(target=worker, args=(r, world, port, shape, a.causal, a.reps, results))
                 for r in range(world)]
        for proc in procs:
            proc.start()
        rows = sorted(results.get(timeout=600) for _ in procs)
        for proc in procs:
            proc.join()
        for rank, t, sent in rows:
            print(f"world {world} rank {rank}: {t * 1e3:.1f} ms, {sent / 2**20:.2f} MiB sent per step")


if __name__ == "__main__":
    main()
