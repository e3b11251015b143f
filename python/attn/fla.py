"""The gated delta rule in the names and signatures of the ``fla`` library (flash-linear-attention),
on the CPU: ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` (Gated DeltaNet:
Qwen3-Next, Qwen3.5, OLMo-hybrid), ``chunk_kda`` and ``fused_recurrent_kda`` (Kimi Delta Attention:
a decay per key channel). Differentiable through torch autograd with respect to ``q``, ``k``, ``v``,
``g``, ``beta`` and ``initial_state``.

Per value head the state ``S [Dk, Dv]`` is decayed by ``exp(g_t)``, corrected and read at every
token: ``S_t = (I − β_t k_t k_tᵀ)·exp(g_t)·S_{t−1} + β_t k_t v_tᵀ``, ``o_t = S_tᵀ (scale·q_t)``.

- ``q, k: [B, T, Hk, Dk]``, ``v: [B, T, Hv, Dv]`` (``Hv`` a multiple of ``Hk``: value head ``h``
  reads key head ``h // (Hv // Hk)``), ``beta: [B, T, Hv]`` in ``[0, 2]``, ``g``: log decays
  ``<= 0``, ``[B, T, Hv]`` (Gated DeltaNet) or ``[B, T, Hv, Dk]`` (KDA).
- ``scale`` defaults to ``1/sqrt(Dk)``; ``use_qk_l2norm_in_kernel`` divides ``q`` and ``k`` by
  ``sqrt(Σx² + 1e-6)`` first.
- ``initial_state`` and the final state: ``[N, Hv, Dk, Dv]`` float32 (float64 for float64 inputs),
  ``N`` the batch or, with ``cu_seqlens`` (``B = 1``, a 1-D integer tensor of sequence boundaries),
  the packed sequences, each starting from its own state.
- Returns ``(o, final_state)``: ``o`` like ``v`` in ``q``'s dtype, ``final_state`` ``None`` unless
  ``output_final_state``.
- The chunked and the recurrent names compute the same rule: float32 runs attn's chunked kernels
  (forward and backward, both gates), float64 the exact token-by-token recurrence (the oracle);
  float16 and bfloat16 compute in float32. Other keyword arguments fla takes (``head_first=False``,
  ``chunk_size``, ``cu_seqlens_cpu``) are accepted and change nothing.
"""

import torch
from torch.utils.dlpack import to_dlpack

from . import _attn


def _compute_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _capsules(tensors, dtype):
    prepared = [None if t is None else t.detach().to(dtype).contiguous() for t in tensors]
    return prepared, [None if t is None else to_dlpack(t) for t in prepared]


class _DeltaRule(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, cu_seqlens, scale, l2norm, channel):
        dtype = _compute_dtype(q)
        prepared, caps = _capsules((q, k, v, g, beta, initial_state), dtype)
        out, final = _attn.delta_forward(*caps, cu_seqlens, scale, l2norm, channel)
        ctx.save_for_backward(*[t for t in prepared if t is not None])
        ctx.call = (initial_state is not None, cu_seqlens, scale, l2norm, channel, dtype)
        ctx.in_dtypes = [None if t is None else t.dtype for t in (q, k, v, g, beta, initial_state)]
        return torch.from_numpy(out).to(q.dtype), torch.from_numpy(final)

    @staticmethod
    def backward(ctx, dout, dfinal):
        has_init, cu_seqlens, scale, l2norm, channel, dtype = ctx.call
        saved = list(ctx.saved_tensors)
        init = saved.pop() if has_init else None
        caps = [to_dlpack(t) for t in saved] + [None if init is None else to_dlpack(init)]
        dout = torch.zeros_like(saved[2]) if dout is None else dout.to(dtype).contiguous()
        dfinal = None if dfinal is None else to_dlpack(dfinal.to(dtype).contiguous())
        grads = _attn.delta_backward(*caps, cu_seqlens, scale, l2norm, channel, to_dlpack(dout), dfinal)
        grads = [torch.from_numpy(x).to(t) if t is not None else None for x, t in zip(grads, ctx.in_dtypes)]
        return (*grads, None, None, None, None)


def _delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens, channel, head_first):
    if head_first:
        raise ValueError("head_first=True is not supported: pass [B, T, H, D] tensors (fla's default layout)")
    if g is None or beta is None:
        raise ValueError("g and beta are required")
    cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
    scale = None if scale is None else float(scale)
    out, final = _DeltaRule.apply(q, k, v, g, beta, initial_state, cu, scale, bool(use_qk_l2norm_in_kernel), channel)
    return out, (final if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, **kwargs):
    """Gated DeltaNet's rule, ``g: [B, T, Hv]`` (see the module's docstring)."""
    return _delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       cu_seqlens, False, head_first)


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                                     **kwargs):
    """The same rule as ``chunk_gated_delta_rule`` (the names the models call for one-token decode)."""
    return _delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       cu_seqlens, False, False)


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, **kwargs):
    """Kimi Delta Attention's rule, ``g: [B, T, Hv, Dk]`` (a log decay per key channel)."""
    return _delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       cu_seqlens, True, head_first)


def fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, cu_seqlens=None, **kwargs):
    """The same rule as ``chunk_kda``."""
    return _delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                       cu_seqlens, True, False)
