"""Checks shared by the NumPy and PyTorch entry points: ranks and head counts, the extras'
types, and the options dictionary the native module (`attn._attn`) takes.

Shapes: ``q: [B, Hq, Lq, Dk]``, ``k: [B, Hkv, Lk, Dk]``, ``v: [B, Hkv, Lk, Dv]`` (or 3-D
``[B, L, D]``, one head); masks broadcast right-aligned to ``[B, Hq, Lq, Lk]``.
"""

import random

ALIGNS = ("top-left", "bottom-right")
COMPUTES = ("f32", "bf16")
# attn's keyword-only extras, in the order the paths read them, and their defaults.
EXTRAS = ("window", "softcap", "align", "key_lengths", "return_lse", "return_weights", "seed", "compute", "sinks")
NO_EXTRAS = dict(zip(EXTRAS, (None, None, "top-left", None, False, False, None, "f32", None)))


def check_ranks(q_shape, k_shape, v_shape, enable_gqa):
    """Whether the inputs are 3-D (one head); refuses other ranks and, without ``enable_gqa``,
    different head counts other than one key/value head (as PyTorch does)."""
    rank = len(q_shape)
    if rank not in (3, 4):
        raise ValueError(f"q: rank {rank} (shape {tuple(q_shape)}), expected 4 [B, Hq, Lq, Dk] or 3 [B, Lq, Dk]")
    for name, shape in (("k", k_shape), ("v", v_shape)):
        if len(shape) != rank:
            raise ValueError(f"{name}: rank {len(shape)} (shape {tuple(shape)}), expected {rank} like q")
    # One key/value head broadcasts over the query heads, as in PyTorch (multi-query attention).
    if rank == 4 and q_shape[1] != k_shape[1] and k_shape[1] != 1 and not enable_gqa:
        raise ValueError(
            f"heads: q has {q_shape[1]} heads and k has {k_shape[1]}; pass enable_gqa=True for grouped-query attention"
        )
    return rank == 3


def window_pair(window):
    """``window=(left, right)``, each a count of keys or ``None`` (unbounded) → a checked pair."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: expected (left, right), each an int or None, found {window!r}")
    for side in window:
        if side is not None and (not isinstance(side, int) or isinstance(side, bool) or side < 0):
            raise ValueError(f"window: {window!r}, each side must be None or an int >= 0")
    return (window[0], window[1])


def lengths(key_lengths):
    """Key lengths `[B]` as a list of ints >= 0."""
    if key_lengths is None:
        return None
    try:
        values = [int(x) for x in (key_lengths.tolist() if hasattr(key_lengths, "tolist") else key_lengths)]
    except (TypeError, ValueError) as e:
        raise TypeError(f"key_lengths: expected a sequence of ints [B] ({e})") from None
    if any(x < 0 for x in values):
        raise ValueError(f"key_lengths: {values}, entries must be >= 0")
    return values


def new_seed():
    """A seed for dropout when none is given, from Python's generator (seeded by the caller
    through ``random.seed``; the PyTorch path draws from ``torch`` instead)."""
    return random.getrandbits(63)


def options(
    *, is_causal, scale, window, softcap, align, key_lengths, dropout_p, seed, compute, keep=None, bias=None, sinks=None
):
    """The options dictionary of one call, checked where the kernels do not check."""
    if align not in ALIGNS:
        raise ValueError(f"align: {align!r}, expected one of {ALIGNS}")
    if compute not in COMPUTES:
        raise ValueError(f"compute: {compute!r}, expected one of {COMPUTES}")
    for name, x in (("scale", scale), ("softcap", softcap), ("dropout_p", dropout_p)):
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
            raise TypeError(f"{name}: expected a float, found {type(x).__name__}")
    if seed is not None and not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed: {seed}, expected 0 <= seed < 2**64")
    return {
        "keep": keep,
        "bias": bias,
        "causal": bool(is_causal),
        "window": window_pair(window),
        "bottom_right": align == "bottom-right",
        "key_lengths": lengths(key_lengths),
        "scale": None if scale is None else float(scale),
        "softcap": None if softcap is None else float(softcap),
        "dropout_p": float(dropout_p),
        "seed": 0 if seed is None else int(seed),
        "bf16_products": compute == "bf16",
        "sinks": sinks,
    }


def results(out, lse, weights, return_lse, return_weights):
    """``out``, or the tuple ``(out, lse?, weights?)`` the flags ask for."""
    if not (return_lse or return_weights):
        return out
    return (out,) + ((lse,) if return_lse else ()) + ((weights,) if return_weights else ())

