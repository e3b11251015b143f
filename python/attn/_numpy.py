"""``attn.sdpa`` on NumPy arrays: float32 and float64 in place, float16 keys and values read in
place (queries widened to float32), all through DLPack capsules (versioned where NumPy has them,
so read-only arrays are read in place too); results handed over by the native module without a
copy.

Shapes: ``q: [B, Hq, Lq, Dk]``, ``k: [B, Hkv, Lk, Dk]``, ``v: [B, Hkv, Lk, Dv]`` → ``out:
[B, Hq, Lq, Dv]``, ``lse: [B, Hq, Lq]``, ``weights: [B, Hq, Lq, Lk]`` (3-D inputs drop the heads).
"""

import numpy as np

from . import _args, _attn

DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.float16): "float16"}


def compute_dtype(name):
    """The type the kernels compute in for inputs of dtype ``name``."""
    return np.float64 if name == "float64" else np.float32


def dtype_name(q, k, v):
    """The common dtype of the inputs, by name; TypeError when unsupported or mixed."""
    names = []
    for label, x in (("q", q), ("k", k), ("v", v)):
        name = DTYPES.get(np.asarray(x).dtype) if isinstance(x, np.ndarray) else None
        if name is None:
            found = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
            raise TypeError(f"{label}: expected a numpy array of float32, float64 or float16, found {found}")
        names.append(name)
    if len(set(names)) != 1:
        raise TypeError(f"q, k, v: dtypes {names} differ; they must be the same")
    return names[0]


def _versioned():
    try:
        np.empty(0).__dlpack__(max_version=(1, 0))
        return True
    except TypeError:
        return False


# NumPy >= 2.1 exports DLPack 1.0 capsules, which may be read-only.
_KW = {"max_version": (1, 0)} if _versioned() else {}


def capsule(x):
    """An array as the DLPack capsule the native module reads (``None`` stays ``None``)."""
    return None if x is None else x.__dlpack__(**_KW)


def mask_parts(attn_mask, dtype, single_head):
    """``attn_mask`` as ``(keep, bias)``: a bool mask keeps where True, a float one is added."""
    if attn_mask is None:
        return None, None
    m = np.asarray(attn_mask)
    if single_head and m.ndim == 3:
        m = m[:, None]
    if m.dtype == np.bool_:
        return np.ascontiguousarray(m), None
    if m.dtype.kind != "f":
        raise TypeError(f"attn_mask: dtype {m.dtype}, expected bool or a float type")
    return None, np.ascontiguousarray(m, dtype=dtype)


def sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extras):
    """The NumPy path of ``attn.sdpa`` (``extras``: window, softcap, align, key_lengths,
    return_lse, return_weights, seed)."""
    name = dtype_name(query, key, value)
    single = _args.check_ranks(query.shape, key.shape, value.shape, enable_gqa)
    lift = (lambda x: x[:, None]) if single else (lambda x: x)
    cdt = compute_dtype(name)
    keep, bias = mask_parts(attn_mask, cdt, single)
    sinks = None if extras["sinks"] is None else np.ascontiguousarray(extras["sinks"], dtype=cdt)
    seed = extras["seed"]
    if seed is None and dropout_p:
        seed = _args.new_seed()
    opts = _args.options(
        is_causal=is_causal, scale=scale, window=extras["window"], softcap=extras["softcap"], align=extras["align"],
        key_lengths=extras["key_lengths"], dropout_p=dropout_p, seed=seed, compute=extras["compute"],
        keep=capsule(keep), bias=capsule(bias), sinks=capsule(sinks),
    )
    q = lift(query).astype(cdt, copy=False)
    out, lse, _, weights = _attn.forward(
        capsule(q), capsule(lift(key)), capsule(lift(value)), opts, bool(extras["return_weights"])
    )
    drop = (lambda x: x[:, 0]) if single else (lambda x: x)
    out = drop(out).astype(query.dtype, copy=False)
    weights = None if weights is None else drop(weights).astype(query.dtype, copy=False)
    return _args.results(out, drop(lse), weights, extras["return_lse"], extras["return_weights"])
