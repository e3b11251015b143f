"""FlashAttention's Python API on attn: ``flash_attn_func`` with FlashAttention's names, layout
and semantics, so code written for ``flash_attn`` runs on the CPU unchanged.

``flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False)``:

- ``q: [B, Lq, Hq, D]``, ``k, v: [B, Lk, Hkv, D]`` (FlashAttention's layout: heads after the
  positions; read in place), ``Hq`` a multiple of ``Hkv`` (grouped-query heads without a flag)
  → ``[B, Lq, Hq, Dv]``, contiguous.
- ``causal`` and ``window_size = (left, right)`` are aligned bottom-right (the last query with the
  last key), ``-1`` = unbounded; query ``i`` sees keys ``j`` with ``i + Lk − Lq − left ≤ j ≤
  i + Lk − Lq + right``.
- ``softcap > 0``: ``softcap·tanh(s/softcap)`` on the scaled scores; ``alibi_slopes`` ``[Hq]`` or
  ``[B, Hq]`` (float32) add ``−slope·|i + Lk − Lq − j|``.
- ``dropout_p``: dropout on the weights (seeded from torch's generator); attn is deterministic
  whatever ``deterministic`` says.
- ``return_attn_probs=True`` returns ``(out, softmax_lse [B, Hq, Lq], probs [B, Hq, Lq, Lk])``
  (the probabilities before dropout; FlashAttention's third result is for testing too).
- Differentiable through torch autograd in ``q``, ``k``, ``v`` (attn's fused backward).

``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``
takes packed sequences, ``q: [total_q, Hq, D]``, ``k, v: [total_k, Hkv, D]``, sequence ``b`` being
rows ``cu_seqlens[b]:cu_seqlens[b+1]`` (int32 offsets ``[B + 1]``), with the same options (each
sequence's causal diagonal and window aligned to its own last key; ALiBi slopes ``[Hq]`` or
``[B, Hq]``) → ``[total_q, Hq, Dv]``; ``return_attn_probs=True`` gives ``(out, softmax_lse [Hq,
total_q], None)`` (no probabilities for packed calls). Sequences are attended one by one; paged
caches (``block_table``) are refused.
"""

import torch

__all__ = ["flash_attn_func", "flash_attn_varlen_func"]


def _alibi_bias(slopes, b, h, lq, lk, dtype):
    """``−slope·|i + Lk − Lq − j|`` as a float mask ``[B or 1, Hq, Lq, Lk]``."""
    slopes = torch.as_tensor(slopes)
    if slopes.shape not in ((h,), (b, h)):
        raise ValueError(f"alibi_slopes: shape {tuple(slopes.shape)}, expected ({h},) or ({b}, {h})")
    i = torch.arange(lq, dtype=torch.float64).view(lq, 1)
    j = torch.arange(lk, dtype=torch.float64).view(1, lk)
    distance = (i + (lk - lq) - j).abs()
    s = slopes.to(torch.float64).reshape(-1, h, 1, 1)
    return (-s * distance).to(dtype)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Attention in FlashAttention's names and layout (see the module's docstring)."""
    from . import sdpa

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor [B, L, H, D], found "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    b, lq, hq, _ = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    left, right = window_size
    window = None if (left < 0 and right < 0) else (None if left < 0 else int(left), None if right < 0 else int(right))
    mask = None if alibi_slopes is None else _alibi_bias(alibi_slopes, b, hq, lq, lk, q.dtype)
    result = sdpa(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, dropout_p=dropout_p,
        is_causal=causal, scale=softmax_scale, enable_gqa=hq != hkv, window=window,
        softcap=softcap if softcap > 0 else None, align="bottom-right", return_lse=True,
        return_weights=bool(return_attn_probs),
    )
    out = result[0].transpose(1, 2).contiguous()
    return (out, *result[1:]) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Packed sequences in FlashAttention's names and layout (see the module's docstring)."""
    if block_table is not None:
        raise ValueError("block_table: paged KV caches are not supported yet")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D tensor [total, H, D], found "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    cq, ck = (torch.as_tensor(c).tolist() for c in (cu_seqlens_q, cu_seqlens_k))
    batch = len(cq) - 1
    for name, c, total, longest in (("cu_seqlens_q", cq, q.shape[0], max_seqlen_q),
                                    ("cu_seqlens_k", ck, k.shape[0], max_seqlen_k)):
        if len(c) != batch + 1 or c[0] != 0 or c[-1] != total or any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"{name}: {c} is not {batch + 1} non-decreasing offsets from 0 to {total}")
        if any(b - a > longest for a, b in zip(c, c[1:])):
            raise ValueError(f"{name}: a sequence is longer than max_seqlen ({longest})")
    slopes = None if alibi_slopes is None else torch.as_tensor(alibi_slopes)
    outs, lses = [], []
    for b in range(batch):
        qb = q[cq[b]:cq[b + 1]].unsqueeze(0)
        kb, vb = k[ck[b]:ck[b + 1]].unsqueeze(0), v[ck[b]:ck[b + 1]].unsqueeze(0)
        sb = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        out, lse, _ = flash_attn_func(qb, kb, vb, dropout_p, softmax_scale, causal, window_size, softcap, sb,
                                      deterministic, return_attn_probs=True)
        outs.append(out[0])
        lses.append(lse[0])
    out = torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[2])
    if not return_attn_probs:
        return out
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0)
    return out, lse, None
