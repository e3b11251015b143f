"""Context-parallel (ring) attention over ``torch.distributed`` (gloo on CPU): each rank holds one
contiguous shard of the sequence, ``q: [B, H, L/W, D]``, ``k, v: [B, Hkv, L/W, D]`` in rank order
(``H`` a multiple of ``Hkv``: grouped-query attention, the shards travelling with their ``Hkv``
heads); the key/value shards travel round the ring (rank r sends to r+1), each rank attends its
queries to every shard as it passes, and the partial results merge through their log-sum-exps.
Under ``is_causal`` a shard later in the sequence than the queries is skipped (it sees nothing)
and the rank's own shard is causal. The backward runs the ring again: the fused backward kernel on
the merged output and log-sum-exp gives each passing shard its share of ``dk, dv``, which travels
with the shard and arrives home after the last step.

``attn_mask`` holds this rank's query rows against all ``L`` keys, broadcast to ``[B, H, L/W, L]``:
bool (True = may attend) or float (added to the scores, differentiable: its gradient comes back in
its own shape and dtype); each passing shard reads its own columns (the mask never travels), and it
combines with ``is_causal`` (attn's rule). A row that sees no key gives 0.

``ring_sdpa(q, k, v, is_causal=False, scale=None, group=None, attn_mask=None)`` returns this rank's
output shard ``[B, H, L/W, Dv]``, differentiable; ``stats()`` the bytes this process has sent.
Every rank must hold shards of the same shape; float32 (other float types compute in float32 and
come back in their own dtype).
"""

import torch
import torch.distributed as dist

from . import _ops
from . import sdpa

_sent = {"bytes": 0}


def stats():
    """Bytes this process has sent through the ring so far."""
    return dict(_sent)


def _rotate(t, group):
    """Sends ``t`` to the next rank and returns the previous rank's tensor of the same shape."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    received = torch.empty_like(t)
    to_next = dist.get_global_rank(group, nxt) if group is not None else nxt
    from_prev = dist.get_global_rank(group, prev) if group is not None else prev
    ops = [dist.P2POp(dist.isend, t, to_next, group), dist.P2POp(dist.irecv, received, from_prev, group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    _sent["bytes"] += t.numel() * t.element_size()
    return received


def _visits(is_causal, rank, world):
    """For each ring step, the shard a rank holds and how it attends it: None (skipped), "full"
    or "causal"."""
    for step in range(world):
        src = (rank - step) % world
        yield step, (None if is_causal and src > rank else "causal" if is_causal and src == rank else "full")


def _merge(out, lse, o, l):
    """Merges a partial ``(o, l)`` into ``(out, lse)`` by their log-sum-exps."""
    if out is None:
        return o, l
    m = torch.maximum(lse, l)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows masked in both: -inf, 0
    a, b = torch.exp(lse - m), torch.exp(l - m)
    total = a + b
    den = torch.where(total > 0, total, torch.ones_like(total))
    return (out * a[..., None] + o * b[..., None]) / den[..., None], m + torch.log(total)


def _keys(mask, src, n):
    """The columns of this rank's mask ``[.., L/W, L]`` for shard ``src`` of ``n`` keys."""
    return None if mask is None else mask[..., src * n:(src + 1) * n].contiguous()


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, group, mask):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        dk, n = k.shape[-1], k.shape[2]
        kv = torch.cat([k, v], -1).contiguous()
        out = lse = None
        for step, how in _visits(is_causal, rank, world):
            if how is not None:
                o, l = sdpa(
                    q, kv[..., :dk], kv[..., dk:], attn_mask=_keys(mask, (rank - step) % world, n),
                    is_causal=how == "causal", scale=scale, enable_gqa=True, return_lse=True,
                )
                out, lse = _merge(out, lse, o, l)
            if step + 1 < world:
                kv = _rotate(kv, group)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.options = (is_causal, scale, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, mask = ctx.saved_tensors
        is_causal, scale, group = ctx.options
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        dk, n = k.shape[-1], k.shape[2]
        bias = mask is not None and mask.is_floating_point()
        want_dmask = bias and ctx.needs_input_grad[6]
        dmask = torch.zeros(mask.shape, dtype=torch.float32) if want_dmask else None
        qf, of, gf = q.float(), out.float(), grad.float()
        residue = torch.zeros_like(lse)
        dq = torch.zeros_like(qf)
        # The shard and its gradient so far travel together: [k | v | dk | dv] on the last axis.
        dv = v.shape[-1]
        cols = [slice(0, dk), slice(dk, dk + dv), slice(dk + dv, 2 * dk + dv), slice(2 * dk + dv, 2 * dk + 2 * dv)]
        travel = torch.cat([k, v, torch.zeros_like(k), torch.zeros_like(v)], -1).float().contiguous()
        for step, how in _visits(is_causal, rank, world):
            if how is not None:
                src = (rank - step) % world
                keep = _keys(mask, src, n)
                keep = keep.float() if bias else keep
                g = _ops.sdpa_backward(
                    gf, qf, travel[..., cols[0]], travel[..., cols[1]], of, lse, residue, keep, want_dmask, 0.0,
                    how == "causal", scale, None, None, False, None, 0, "f32",
                )
                dq += g[0]
                if want_dmask:
                    dmask[..., src * n:(src + 1) * n] += g[3]
                travel[..., cols[2]] += g[1]
                travel[..., cols[3]] += g[2]
            travel = _rotate(travel, group)
        # After `world` rotations each shard's gradient is back with its owner.
        dk_home, dv_home = travel[..., cols[2]], travel[..., cols[3]]
        dmask = None if dmask is None else dmask.to(mask.dtype)
        return dq.to(q.dtype), dk_home.to(k.dtype), dv_home.to(v.dtype), None, None, None, dmask


def ring_sdpa(q, k, v, is_causal=False, scale=None, group=None, attn_mask=None):
    """Ring attention of this rank's shards (see the module's docstring)."""
    if not dist.is_initialized():
        raise ValueError("ring_sdpa: torch.distributed is not initialised (init_process_group('gloo', ...))")
    if q.dim() != 4 or k.dim() != 4 or k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"ring_sdpa: q {tuple(q.shape)} and k {tuple(k.shape)}: expected [B, H, L/W, D] with q's heads "
            "a multiple of k's"
        )
    if attn_mask is not None:
        total = k.shape[2] * dist.get_world_size(group)
        kind = attn_mask.dtype == torch.bool or attn_mask.is_floating_point()
        if not kind or attn_mask.dim() > 4 or attn_mask.shape[-1] != total:
            raise ValueError(
                f"ring_sdpa: attn_mask {attn_mask.dtype} {tuple(attn_mask.shape)}: expected a bool or float mask of "
                f"this rank's queries against all {total} keys, broadcast to [B, H, L/W, {total}]"
            )
    return _Ring.apply(q, k, v, is_causal, scale, group, attn_mask)
