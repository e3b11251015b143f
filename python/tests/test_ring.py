"""Ring (context-parallel) attention over torch.distributed gloo on loopback, 2 and 4 processes,
with as many key/value heads as query heads and with grouped-query attention, bool and float masks:
each rank's output shard and the gradients of its q, k, v shards (and of its rows of a float mask)
equal the single-process result under the team's rule against float64."""

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


def full_mask(kind):
    """A mask over the whole sequence: None, bool key padding ``[B, 1, 1, L]`` (the last 11 keys
    padded), bool random ``[B, 1, L, L]`` with a whole row masked, or a float ``[B, 1, L, L]`` bias
    with a fifth of its entries and a whole row −∞ (float64)."""
    if kind is None:
        return None
    if kind == "padding":
        return (torch.arange(L) < L - 11).reshape(1, 1, 1, L).expand(B, 1, 1, L)
    g = torch.Generator().manual_seed(1)
    if kind == "bias":
        m = torch.randn(B, 1, L, L, generator=g, dtype=torch.float64)
        m[torch.rand(B, 1, L, L, generator=g) > 0.8] = float("-inf")
        m[..., 7, :] = float("-inf")
        return m
    m = torch.rand(B, 1, L, L, generator=g) > 0.4
    m[..., 5, :] = False
    return m


def rank_mask(kind, rank, world):
    """This rank's rows of the mask, against all keys."""
    m = full_mask(kind)
    if m is None or m.shape[2] == 1:
        return m
    return m[:, :, rank * (L // world):(rank + 1) * (L // world)]


def worker(rank, world, port, causal, hkv, mask, results):
    os.environ["RAYON_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import torch.distributed as dist

    from attn.ring import ring_sdpa, stats

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        q, k, v, grad = (t.chunk(world, dim=2)[rank].float().contiguous() for t in full_inputs(hkv))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        m = rank_mask(mask, rank, world)
        m = m.float().requires_grad_() if m is not None and m.is_floating_point() else m
        out = ring_sdpa(q, k, v, is_causal=causal, attn_mask=m)
        out.backward(grad)
        tensors = [out, q.grad, k.grad, v.grad] + ([m.grad] if m is not None and m.requires_grad else [])
        # NumPy copies: a tensor would travel as shared memory that dies with this process.
        results.put((rank, [t.detach().numpy().copy() for t in tensors], stats()["bytes"]))
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single(dtype, causal, hkv, mask):
    """Attention on the whole sequence as the formula reads, in ``dtype``, differentiable (a bool
    mask and causal as one mask, a float mask added to the scores; a fully masked row gives 0):
    ``[out, dq, dk, dv]`` and the float mask's gradient."""
    q, k, v, grad = full_inputs(hkv)
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    m = full_mask(mask)
    bias = m.to(dtype).requires_grad_() if m is not None and m.is_floating_point() else None
    m = torch.ones(B, 1, L, L, dtype=torch.bool) if m is None or bias is not None else m.expand(B, 1, L, L)
    if causal:
        m = m & torch.ones(L, L, dtype=torch.bool).tril()
    kk, vv = k.repeat_interleave(H // hkv, 1), v.repeat_interleave(H // hkv, 1)
    s = (q @ kk.transpose(-1, -2)) * D**-0.5
    s = (s if bias is None else s + bias).masked_fill(~m, float("-inf"))
    empty = ~torch.isfinite(s).any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0), -1).masked_fill(empty, 0)
    out = p @ vv
    out.backward(grad.to(dtype))
    return [out.detach(), q.grad, k.grad, v.grad] + ([] if bias is None else [bias.grad])


@pytest.mark.parametrize(
    "world, causal, hkv, mask",
    [
        (2, False, H, None), (2, True, H, None), (4, False, H, None), (4, True, H, None), (2, True, 2, None),
        (4, False, 1, None), (2, True, 2, "padding"), (4, False, H, "random"), (2, True, 2, "bias"),
        (4, False, H, "bias"),
    ],
    ids=["2-full", "2-causal", "4-full", "4-causal", "2-causal-gqa", "4-full-mqa", "2-causal-padding",
         "4-random-mask", "2-causal-gqa-bias", "4-full-bias"],
)
def test_ring_equals_single_process(world, causal, hkv, mask):
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, causal, hkv, mask, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = dict((r[0], r[1:]) for r in (results.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ref64 = single(torch.float64, causal, hkv, mask)
    naive32 = single(torch.float32, causal, hkv, mask)
    ring = [torch.cat([torch.from_numpy(got[r][0][i]) for r in range(world)], dim=2) for i in range(len(ref64))]
    for i, name in enumerate(["out", "dq", "dk", "dv", "dmask"]):
        if i < len(ref64):
            assert_oracle(ring[i], naive32[i], ref64[i], k=2 if i == 0 else 3, floor=1e-6, what=name)
    shard_bytes = B * hkv * (L // world) * 2 * D * 4
    # Forward: world-1 shard rotations; backward: world rotations of shard + gradient (twice the size).
    assert all(got[r][1] == (world - 1) * shard_bytes + world * 2 * shard_bytes for r in range(world))
