"""Ring (context-parallel) attention over torch.distributed gloo on loopback, 2 and 4 processes,
with as many key/value heads as query heads and with grouped-query attention: each rank's output
shard and the gradients of its q, k, v shards equal the single-process result under the team's rule
against float64."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from conftest import assert_oracle

B, H, L, D = 1, 4, 64, 16


def full_inputs(hkv):
    g = torch.Generator().manual_seed(0)
    # q, k, v, grad
    return [torch.randn(B, h, L, D, generator=g, dtype=torch.float64) for h in (H, hkv, hkv, H)]


def worker(rank, world, port, causal, hkv, results):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from attn.ring import ring_sdpa, stats

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        q, k, v, grad = (t.chunk(world, dim=2)[rank].float().contiguous() for t in full_inputs(hkv))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = ring_sdpa(q, k, v, is_causal=causal)
        out.backward(grad)
        # NumPy copies: a tensor would travel as shared memory that dies with this process.
        results.put((rank, *(t.detach().numpy().copy() for t in (out, q.grad, k.grad, v.grad)), stats()["bytes"]))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single(dtype, fn, causal, hkv):
    q, k, v, grad = full_inputs(hkv)
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, is_causal=causal, enable_gqa=hkv != H)
    out.backward(grad.to(dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize(
    "world, causal, hkv",
    [(2, False, H), (2, True, H), (4, False, H), (4, True, H), (2, True, 2), (4, False, 1)],
    ids=["2-full", "2-causal", "4-full", "4-causal", "2-causal-gqa", "4-full-mqa"],
)
def test_ring_equals_single_process(world, causal, hkv):
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, causal, hkv, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = dict((r[0], r[1:]) for r in (results.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ring = [torch.cat([torch.from_numpy(got[r][i]) for r in range(world)], dim=2) for i in range(4)]
    ref64 = single(torch.float64, torch.nn.functional.scaled_dot_product_attention, causal, hkv)
    naive32 = single(torch.float32, torch.nn.functional.scaled_dot_product_attention, causal, hkv)
    for i, name in enumerate(["out", "dq", "dk", "dv"]):
        assert_oracle(ring[i], naive32[i], ref64[i], k=2 if i == 0 else 3, floor=1e-6, what=name)
    shard_bytes = B * hkv * (L // world) * 2 * D * 4
    # Forward: world-1 shard rotations; backward: world rotations of shard + gradient (twice the size).
    assert all(got[r][4] == (world - 1) * shard_bytes + world * 2 * shard_bytes for r in range(world))
