"""attn as a Hugging Face ``transformers`` attention implementation: ``register()`` adds
``"attn"`` to ``AttentionInterface`` (and to ``AttentionMaskInterface`` with the ``sdpa`` boolean
masks), after which ``AutoModel*.from_config(cfg, attn_implementation="attn")`` runs attention
through ``attn.sdpa``. Grouped-query attention runs natively (no repeated keys/values).

The attention function receives ``query: [B, Hq, Lq, D]``, ``key``/``value: [B, Hkv, Lk, D]`` and
returns ``([B, Lq, Hq, D], None)`` as ``transformers`` expects.
"""

from . import sdpa

NAME = "attn"


def attn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The ``transformers`` attention function (the ``sdpa`` one's contract)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = query.shape[2] > 1 and attention_mask is None and bool(is_causal)
    out = sdpa(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal,
        enable_gqa=True, softcap=kwargs.get("softcap"),
    )
    return out.transpose(1, 2).contiguous(), None


def register():
    """Makes ``attn_implementation="attn"`` available (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attn_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
