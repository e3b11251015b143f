"""attn: scaled dot-product attention on the CPU (exact reference and fast tiled kernels, forward
and fused backward) for NumPy arrays and PyTorch tensors.

``attn.sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
enable_gqa=False, *, window=None, softcap=None, align="top-left", key_lengths=None,
return_lse=False, return_weights=False, seed=None, compute="f32", sinks=None)`` follows
``torch.nn.functional.scaled_dot_product_attention``:

- ``q: [B, Hq, Lq, Dk]``, ``k: [B, Hkv, Lk, Dk]``, ``v: [B, Hkv, Lk, Dv]`` → ``[B, Hq, Lq, Dv]``;
  3-D ``[B, L, D]`` inputs are one head. ``Hq`` a multiple of ``Hkv`` needs ``enable_gqa=True``.
- ``attn_mask``: bool (True = may attend) or float (added to the scaled scores), broadcast
  right-aligned to ``[B, Hq, Lq, Lk]``. Unlike PyTorch it may be combined with ``is_causal``.
- ``scale``: defaults to ``1/sqrt(Dk)``. ``dropout_p``: dropout on the weights, always applied when
  non-zero (as in PyTorch); its draws are a function of ``seed`` (drawn from ``torch``'s, or for
  NumPy Python's, generator when None), and the backward replays them.
- Extras: ``window=(left, right)`` sliding window around the diagonal (``None`` = unbounded side);
  ``softcap``: ``cap·tanh(s/cap)`` on the scaled scores; ``align``: where the causal diagonal sits
  when ``Lq != Lk`` (``"top-left"`` as PyTorch, ``"bottom-right"`` as FlashAttention);
  ``key_lengths``: valid keys per batch ``[B]``; ``sinks``: a learned sink logit per query head
  ``[Hq]`` (gpt-oss) that joins each row's softmax denominator (rows then sum to less than 1),
  differentiable.
- Returns ``out``, or ``(out, lse)``, ``(out, weights)``, ``(out, lse, weights)`` with
  ``return_lse``/``return_weights``: ``lse [B, Hq, Lq]`` in the compute type (float32, float64 for
  float64 inputs), ``weights [B, Hq, Lq, Lk]`` before dropout. With PyTorch tensors all three
  carry gradients: a loss that reads ``lse`` or ``weights`` reaches ``q``, ``k``, ``v`` and a float
  mask through them.
- ``compute``: ``"f32"`` (default) or ``"bf16"``: bfloat16 products with float32 accumulation in
  the forward and the backward (q, k, v, the output gradient, the probabilities and their
  gradients rounded to bfloat16 where they enter a product, as FlashAttention computes on bfloat16
  inputs; native on AVX512-BF16, emulated elsewhere); the softmax, its gradient, the output and the
  gradients stay in float32. Not for float64 inputs.
- Types: NumPy float32/float64/float16 arrays or PyTorch CPU float32/float64/float16/bfloat16
  tensors, all alike, read in place through DLPack (bfloat16 as bfloat16); the result is of the
  same kind and dtype. float16/bfloat16 compute in float32 (keys and values read as stored, the
  queries widened); float64 runs the exact reference kernel.
- Threads: the kernels run in attn's own pool of ``get_num_threads()`` threads
  (``RAYON_NUM_THREADS``, else the cores, until ``set_num_threads(n)``), apart from PyTorch's; a
  forked child starts a pool of its own.
- Bad input raises ``ValueError`` or ``TypeError`` with the library's message.

``attn.flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
return_attn_probs=False)`` is FlashAttention's function with its ``[B, L, H, D]`` layout and
bottom-right causal alignment; ``attn.flash_attn_varlen_func`` its packed-sequence form and
``attn.flash_attn_with_kvcache`` its dense or paged KV-cache form (``attn.flash``).

``attn.torch`` registers the ``attn::sdpa_forward`` / ``attn::sdpa_backward`` operators (autograd,
``torch.compile``) and offers ``patch()``/``patched()``; ``attn.hf.register()`` makes
``attn_implementation="attn"`` available to Hugging Face ``transformers``.
"""

import os
import sys

from ._attn import ISA, forget_after_fork, get_num_threads, set_num_threads

__all__ = [
    "sdpa", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "ISA", "get_num_threads",
    "set_num_threads",
]

# A forked child inherits attn's thread pool without its threads: it starts its own.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_after_fork)


def sdpa(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    window=None,
    softcap=None,
    align="top-left",
    key_lengths=None,
    return_lse=False,
    return_weights=False,
    seed=None,
    compute="f32",
    sinks=None,
):
    """Scaled dot-product attention (see the module's docstring)."""
    extras = dict(
        window=window, softcap=softcap, align=align, key_lengths=key_lengths, return_lse=return_lse,
        return_weights=return_weights, seed=seed, compute=compute, sinks=sinks,
    )
    return _path(query)(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extras)


_FLASH = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")


def __getattr__(name):
    """FlashAttention's functions (``attn.flash``), imported with PyTorch on first use."""
    if name in _FLASH:
        from . import flash

        return getattr(flash, name)
    raise AttributeError(f"module 'attn' has no attribute {name!r}")


_paths = {}


def _path(query):
    """The PyTorch path for a tensor, the NumPy path otherwise (each imported once, on first use;
    PyTorch is never imported for NumPy input)."""
    torch = sys.modules.get("torch")
    kind = "torch" if torch is not None and isinstance(query, torch.Tensor) else "numpy"
    if kind not in _paths:
        if kind == "torch":
            from .torch import sdpa as path
        else:
            from ._numpy import sdpa as path
        _paths[kind] = path
    return _paths[kind]
