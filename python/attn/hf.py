"""attn as a Hugging Face ``transformers`` attention implementation: ``register()`` adds
``"attn"`` to ``AttentionInterface`` (and to ``AttentionMaskInterface`` with the ``sdpa`` boolean
masks), after which ``AutoModel*.from_config(cfg, attn_implementation="attn")`` runs attention
through ``attn.sdpa``. Grouped-query attention runs natively (no repeated keys/values).

The attention function takes what ``transformers``' ``sdpa_attention_forward`` takes, and more:
``query: [B, Hq, Lq, Dk]``, ``key: [B, Hkv, Lk, Dk]``, ``value: [B, Hkv, Lk, Dv]``, a bool or
float ``attention_mask``, ``position_bias`` (T5's relative positions: added to the scaled
scores, differentiable), a ``PagedAttentionCache`` as ``cache`` (updated first, as ``sdpa``
does), ``softcap`` (Gemma 2) and gpt-oss's learned sinks ``s_aux``; the ``sliding_window`` a
model hands is already in its mask. It returns ``([B, Lq, Hq, Dv], weights)``: the attention
weights ``[B, Hq, Lq, Lk]`` when the model is asked for them (``output_attentions``, as an
argument or in the config), ``None`` otherwise. The weights are those before dropout
(``eager``'s are after it), differentiable, and a row sums to less than 1 with sinks (as
``eager``'s for gpt-oss, which leave the sink out).

``register()`` also points the linear-attention layers of the hybrid models — Qwen3-Next, Qwen3.5
(and its MoE), OLMo-hybrid (Gated DeltaNet) and Kimi Linear (KDA) — at ``attn.fla``'s kernels
instead of their PyTorch fallbacks (``torch_chunk_gated_delta_rule`` and the rest, the names the
layers call when the ``fla`` package is absent): it replaces those names in the models' modules,
so it works for models built before or after the call, and packed sequences (``cu_seqlens``),
which the fallbacks refuse, run. ``restore_delta_rule()`` puts the fallbacks back.
"""

import importlib

import torch

from . import fla, sdpa

NAME = "attn"


def _with_bias(attention_mask, position_bias):
    """One float mask for both, as ``sdpa`` combines them: a bool mask keeps the bias where True
    (``-inf``, which attn takes as masked, elsewhere), a float one is added to it."""
    if attention_mask is None:
        return position_bias
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, float("-inf"))
    return position_bias + attention_mask


def _wants_weights(module, kwargs):
    """Whether ``transformers`` records this layer's weights: ``output_attentions`` reaches the
    attention function as an argument, while the config's flag (which ``capture_outputs`` reads
    too) does not."""
    asked = kwargs.get("output_attentions")
    if asked is None:
        asked = getattr(getattr(module, "config", None), "output_attentions", False)
    return bool(asked)


def attn_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, position_bias=None,
    cache=None, **kwargs,
):
    """The ``transformers`` attention function (see the module's docstring)."""
    if cache is not None:
        # Continuous batching's paged cache (transformers' own checks admit only "sdpa", "paged|eager"
        # and the flash names, so it reaches attn registered under one of those).
        from transformers.generation.continuous_batching.cache import PagedAttentionCache

        if isinstance(cache, PagedAttentionCache):
            key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As ``sdpa``: causal only for a prefill without a mask (a mask already holds the causal part).
    is_causal = query.shape[2] > 1 and attention_mask is None and bool(is_causal)
    if position_bias is not None:
        # attn takes a float mask together with ``is_causal``: no causal mask to build.
        attention_mask = _with_bias(attention_mask, position_bias)
    want = _wants_weights(module, kwargs)
    result = sdpa(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=True, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"), return_weights=want,
    )
    out, weights = result if want else (result, None)
    return out.transpose(1, 2).contiguous(), weights


# The models' modules and, in each, the fallback's name -> attn's kernel.
_GATED = {"torch_chunk_gated_delta_rule": fla.chunk_gated_delta_rule,
          "torch_recurrent_gated_delta_rule": fla.fused_recurrent_gated_delta_rule}
DELTA_RULE_MODULES = {
    "qwen3_next": _GATED,
    "qwen3_5": _GATED,
    "qwen3_5_moe": _GATED,
    "olmo_hybrid": _GATED,
    "kimi_linear": {"chunk_kimi_delta_attention": fla.chunk_kda,
                    "recurrent_kimi_delta_attention": fla.fused_recurrent_kda},
}
_FALLBACKS = {}


def _delta_rule_modules():
    """The models' modules this ``transformers`` has, with their replacements."""
    for name, functions in DELTA_RULE_MODULES.items():
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        yield module, functions


def restore_delta_rule():
    """Puts the models' own delta-rule functions back (undoes that part of ``register()``)."""
    for module, functions in _delta_rule_modules():
        for fn in functions:
            if (module.__name__, fn) in _FALLBACKS:
                setattr(module, fn, _FALLBACKS.pop((module.__name__, fn)))


def register():
    """Makes ``attn_implementation="attn"`` available and the hybrid models' linear attention run
    on attn's delta-rule kernels (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attn_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    for module, functions in _delta_rule_modules():
        for fn, kernel in functions.items():
            _FALLBACKS.setdefault((module.__name__, fn), getattr(module, fn))
            setattr(module, fn, kernel)
