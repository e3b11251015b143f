"""attn as a Hugging Face ``transformers`` attention implementation: ``register()`` adds
``"attn"`` to ``AttentionInterface`` (and to ``AttentionMaskInterface`` with the ``sdpa`` boolean
masks), after which ``AutoModel*.from_config(cfg, attn_implementation="attn")`` runs attention
through ``attn.sdpa``. Grouped-query attention runs natively (no repeated keys/values).

The attention function receives ``query: [B, Hq, Lq, D]``, ``key``/``value: [B, Hkv, Lk, D]`` and
returns ``([B, Lq, Hq, D], None)`` as ``transformers`` expects.
"""

import warnings

from . import sdpa

NAME = "attn"


# What some models hand their attention function that attn's Python entry point does not take yet:
# ignoring it would change the model's results without a word.
REFUSED = {
    "position_bias": "an additive position bias (position_bias) is not taken; pass it as attention_mask",
}


def attn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The ``transformers`` attention function (the ``sdpa`` one's contract; gpt-oss's sinks
    ``s_aux`` join each row's softmax, differentiable). Refuses, with
    ``ValueError``, the arguments in ``REFUSED``; ``output_attentions`` gets no weights (as ``sdpa``),
    with a warning."""
    for name, why in REFUSED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"attn_implementation='attn': {why}; use 'eager' for this model")
    if kwargs.get("output_attentions", False):
        warnings.warn("attn_implementation='attn' returns no attention weights (output_attentions)", stacklevel=2)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and bool(is_causal)
    out = sdpa(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=True, softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"),
    )
    return out.transpose(1, 2).contiguous(), None


def register():
    """Makes ``attn_implementation="attn"`` available (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attn_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
