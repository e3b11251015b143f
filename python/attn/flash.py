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
total_q], None)`` (no probabilities for packed calls). Sequences are attended one by one. With
``block_table`` (``[B, max_pages]``), ``k`` and ``v`` are pages ``[num_pages, page_size, Hkv, D]``
and ``cu_seqlens_k`` gives each sequence's cached length: each sequence runs the paged kernel of
``flash_attn_with_kvcache`` (forward only; no ALiBi or dropout there).

``flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None,
block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
alibi_slopes=None, return_softmax_lse=False)``: decoding and chunked prefill against a cache,
``q: [B, Lq, Hq, D]``; the cache dense ``[B, Lmax, Hkv, D]`` or paged ``[pages, page_size, Hkv,
D]`` with ``block_table: [B, max_pages]`` (int32 page numbers); ``cache_seqlens`` (int or
``[B]``, default: the cache full) says how many positions of each sequence hold keys. New ``k, v:
[B, Lnew, Hkv, D]`` are written into the cache (in place) at ``cache_seqlens`` first; each
sequence then attends its first ``cache_seqlens[b] + Lnew`` keys, causal and window aligned to its
own last key → ``[B, Lq, Hq, Dv]`` (and ``softmax_lse [B, Hq, Lq]``, float32, or float64 for
float64 inputs). Every sequence is
attended in one call of attn's paged kernel, reading the pages in place (float32, float16 or
bfloat16; a dense cache is B pages of ``Lmax`` positions), a long sequence's keys split over the
threads and merged by their log-sum-exps; queries are computed in float32 and the output returned
in q's dtype. With ``alibi_slopes``, or in float64 (attn's float64 kernel), each sequence is
attended alone over its keys gathered from the cache. Not differentiable (FlashAttention's is
not either). A row that sees no key (an empty cache and no
new keys) gives output 0 and ``softmax_lse`` −∞, ``logsumexp``'s value over no terms
(FlashAttention's CUDA kernels write +∞ there on their unsplit path and −∞ on the split one).
Rotary embedding inside the call (``rotary_cos``/``rotary_sin``) is not taken: apply it before.
"""

import torch
from torch.utils.dlpack import to_dlpack

from . import _attn

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _window(window_size):
    """FlashAttention's ``(left, right)``, ``-1`` unbounded, as attn's window (``None``: none)."""
    left, right = window_size
    return None if (left < 0 and right < 0) else (None if left < 0 else int(left), None if right < 0 else int(right))


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
    window = _window(window_size)
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
    paged = block_table is not None
    for name, t, rank in (("q", q, 3), ("k", k, 4 if paged else 3), ("v", v, 4 if paged else 3)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            layout = "[num_pages, page_size, H, D] (block_table given)" if rank == 4 else "[total, H, D]"
            raise ValueError(f"{name}: expected a {rank}-D tensor {layout}, found "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    cq, ck = (torch.as_tensor(c).tolist() for c in (cu_seqlens_q, cu_seqlens_k))
    batch = len(cq) - 1
    k_total = ck[-1] if paged and ck else k.shape[0]
    for name, c, total, longest in (("cu_seqlens_q", cq, q.shape[0], max_seqlen_q),
                                    ("cu_seqlens_k", ck, k_total, max_seqlen_k)):
        if len(c) != batch + 1 or c[0] != 0 or c[-1] != total or any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"{name}: {c} is not {batch + 1} non-decreasing offsets from 0 to {total}")
        if any(b - a > longest for a, b in zip(c, c[1:])):
            raise ValueError(f"{name}: a sequence is longer than max_seqlen ({longest})")
    if paged:
        if alibi_slopes is not None or dropout_p > 0:
            raise ValueError("alibi_slopes, dropout_p: not supported with block_table")
        outs, lses = [], []
        for b in range(batch):
            out, lse = flash_attn_with_kvcache(
                q[cq[b]:cq[b + 1]].unsqueeze(0), k, v, cache_seqlens=[ck[b + 1] - ck[b]], block_table=block_table[b:b + 1],
                softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                return_softmax_lse=True)
            outs.append(out[0])
            lses.append(lse[0])
        out = torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[3])
        lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0)
        return (out, lse, None) if return_attn_probs else out
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


def _positions(block_table, b, start, stop, page_size):
    """``(page, offset)`` tensors of sequence ``b``'s positions ``start..stop`` in a paged cache."""
    pos = torch.arange(start, stop)
    return block_table[b].long()[pos // page_size], pos % page_size


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention against a dense or paged KV cache in FlashAttention's names (see the module's
    docstring)."""
    for name, arg in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                      ("cache_leftpad", cache_leftpad)):
        if arg is not None:
            raise ValueError(f"{name}: not supported (apply rotary embeddings before the call; "
                             "index the cache yourself)")
    if (k is None) != (v is None):
        raise ValueError("k and v: give both new keys and values, or neither")
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"q, k_cache, v_cache: expected 4-D tensors, found {q.dim()}-D, {k_cache.dim()}-D, "
                         f"{v_cache.dim()}-D")
    batch, new = q.shape[0], 0 if k is None else k.shape[1]
    paged = block_table is not None
    if paged and block_table.numel() and (int(block_table.min()) < 0 or int(block_table.max()) >= k_cache.shape[0]):
        raise ValueError(f"block_table: page numbers must lie in [0, {k_cache.shape[0]}), found "
                         f"{int(block_table.min())}..{int(block_table.max())}")
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if cache_seqlens is None:
        seqlens = [capacity - new] * batch
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * batch
    else:
        seqlens = torch.as_tensor(cache_seqlens).tolist()
    if len(seqlens) != batch or any(n < 0 or n + new > capacity for n in seqlens):
        raise ValueError(f"cache_seqlens: {seqlens} for {batch} sequences of {new} new keys "
                         f"in a cache of {capacity} positions")
    for b in range(batch):
        n = seqlens[b]
        if new:
            with torch.no_grad():
                if paged:
                    page, off = _positions(block_table, b, n, n + new, k_cache.shape[1])
                    k_cache[page, off] = k[b].to(k_cache.dtype)
                    v_cache[page, off] = v[b].to(v_cache.dtype)
                else:
                    k_cache[b, n:n + new] = k[b].to(k_cache.dtype)
                    v_cache[b, n:n + new] = v[b].to(v_cache.dtype)
    lengths = [n + new for n in seqlens]
    if alibi_slopes is None and torch.float64 not in (q.dtype, k_cache.dtype, v_cache.dtype):
        # A dense cache [B, Lmax, Hkv, D] is a paged one of B pages of Lmax positions, page b
        # sequence b's: one kernel call either way, every sequence against its own length.
        table = block_table if paged else torch.arange(batch, dtype=torch.int32).view(batch, 1)
        pages = [c if c.is_contiguous() else c.contiguous() for c in (k_cache, v_cache)]
        window = _window(window_size)
        out, lse = _attn.paged_forward(
            to_dlpack(q.detach().transpose(1, 2).float()), to_dlpack(pages[0].detach()), to_dlpack(pages[1].detach()),
            table.to(torch.int32).flatten().tolist(), lengths, softmax_scale, bool(causal), window,
            softcap if softcap > 0 else None)
        out = torch.from_numpy(out).transpose(1, 2).to(q.dtype).contiguous()
        lse = torch.from_numpy(lse)
        return (out, lse) if return_softmax_lse else out
    # ALiBi (not a paged-kernel option) or float64 (the reference kernel): each sequence over its
    # keys gathered from the cache.
    slopes = None if alibi_slopes is None else torch.as_tensor(alibi_slopes)
    outs, lses = [], []
    for b in range(batch):
        if paged:
            page, off = _positions(block_table, b, 0, lengths[b], k_cache.shape[1])
            keys, values = k_cache[page, off], v_cache[page, off]
        else:
            keys, values = k_cache[b, :lengths[b]], v_cache[b, :lengths[b]]
        sb = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        out, lse, _ = flash_attn_func(q[b:b + 1], keys[None], values[None], 0.0, softmax_scale, causal, window_size,
                                      softcap, sb, return_attn_probs=True)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs), torch.cat(lses)
    return (out, lse) if return_softmax_lse else out
