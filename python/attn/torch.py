"""attn inside PyTorch: ``attn.sdpa``'s path for CPU tensors (through the ``attn::sdpa_forward``
operator under ``torch.compile``, its autograd without the dispatcher when an eager call needs a
gradient, straight to the kernels otherwise), and
``patch()`` / ``patched()``, which route ``torch.nn.functional.scaled_dot_product_attention`` on
CPU tensors through attn and fall back to PyTorch, with one warning per reason, for what attn
does not take (another device, another dtype, ranks other than 3 and 4, a mask together with
``is_causal`` or of another dtype than the inputs, an input the kernels refuse). Inside the patch
PyTorch's behaviour is the contract: its ``CausalBias`` masks run as attn's causal alignments,
other tensor subclasses decide through ``__torch_function__`` as they would for PyTorch's own
function, and what attn does not take reaches PyTorch, whose errors the caller gets.

Tensors: ``q: [B, Hq, Lq, Dk]``, ``k: [B, Hkv, Lk, Dk]``, ``v: [B, Hkv, Lk, Dv]`` (or 3-D
``[B, L, D]``), float32, float64, float16 or bfloat16, all alike, on the CPU, last dimension
contiguous (other strides are read in place). float16/bfloat16 keys and values are read in
place and the queries widened to float32; the output comes back in the inputs' dtype.
"""

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, CausalVariant
from torch.overrides import handle_torch_function, has_torch_function

from . import _args
from ._attn import InternalError
from ._ops import OPTIONS, STORAGE, Eager, native_options, run_forward, sdpa_forward, storageless

__all__ = ["patch", "unpatch", "patched"]


def _check(query, key, value, attn_mask):
    tensors = (("q", query), ("k", key), ("v", value), ("attn_mask", attn_mask))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) and not (t is None and name == "attn_mask"):
            raise TypeError(f"{name}: expected a torch.Tensor, found {type(t).__name__}")
        if t is not None and not t.is_cpu:
            raise ValueError(f"{name}: on {t.device}; attn runs on the CPU (copy it with .cpu())")
    if query.dtype not in STORAGE:
        raise TypeError(f"q: dtype {query.dtype}, expected float32, float64, float16 or bfloat16")
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"q, k, v: dtypes {query.dtype}, {key.dtype}, {value.dtype} differ; they must be the same")


def _compact(m):
    """A mask with every broadcast (stride-0) dimension narrowed to size 1, made contiguous:
    the same mask under broadcasting, without materialising the expansion."""
    index = tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(m.stride(), m.shape))
    return m[index].contiguous()


def _mask(attn_mask, dtype, single_head):
    """``attn_mask`` as the operator takes it: a bool keep-mask, or a float bias in ``dtype``."""
    if attn_mask is None:
        return None
    if single_head and attn_mask.dim() == 3:
        attn_mask = attn_mask.unsqueeze(1)
    if attn_mask.dtype == torch.bool:
        return _compact(attn_mask)
    if not attn_mask.dtype.is_floating_point:
        raise TypeError(f"attn_mask: dtype {attn_mask.dtype}, expected bool or a float type")
    m = attn_mask.to(dtype)
    return m.contiguous() if m.requires_grad else _compact(m)


def _sinks(sinks, dtype, heads):
    """``sinks`` as the operator takes them: a contiguous ``[Hq]`` tensor in ``dtype``."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor) or not sinks.dtype.is_floating_point:
        raise TypeError(f"sinks: expected a float torch.Tensor [Hq], found {getattr(sinks, 'dtype', type(sinks))}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks: shape {tuple(sinks.shape)}, expected [Hq] = ({heads},)")
    return sinks.to(dtype).contiguous()


def sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extras):
    """The PyTorch path of ``attn.sdpa`` (``extras``: window, softcap, align, key_lengths,
    return_lse, return_weights, seed, compute)."""
    seed, return_lse, return_weights = extras["seed"], extras["return_lse"], extras["return_weights"]
    _check(query, key, value, attn_mask)
    single = _args.check_ranks(query.shape, key.shape, value.shape, enable_gqa)
    if seed is None and dropout_p:
        seed = int(torch.randint(0, 2**62, ()).item())
    o = _args.options(
        is_causal=is_causal, scale=scale, window=extras["window"], softcap=extras["softcap"], align=extras["align"],
        key_lengths=extras["key_lengths"], dropout_p=dropout_p, seed=seed, compute=extras["compute"],
    )
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    q, k, v = (query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)) if single else (query, key, value)
    if q.dtype != compute:
        q = q.to(compute)
    mask = _mask(attn_mask, compute, single)
    sinks = _sinks(extras["sinks"], compute, q.shape[1])
    win = None if o["window"] is None else [-1 if x is None else x for x in o["window"]]
    named = dict(
        dropout_p=o["dropout_p"], is_causal=o["causal"], scale=o["scale"], window=win, softcap=o["softcap"],
        bottom_right=o["bottom_right"], key_lengths=o["key_lengths"], seed=o["seed"], compute=extras["compute"],
    )
    args = tuple(named[name] for name, _ in OPTIONS)
    tracked = any(t is not None and t.requires_grad for t in (q, k, v, mask, sinks))
    if torch.compiler.is_compiling() or storageless(q, k, v, mask, sinks):
        out, lse, _, weights = sdpa_forward(q, k, v, mask, *args, bool(return_weights), sinks)
    elif tracked and torch.is_grad_enabled():
        out, lse, _, weights = Eager.apply(q, k, v, mask, *args, bool(return_weights), sinks)
    else:
        out, lse, _, weights = (None if x is None else torch.from_numpy(x) for x in run_forward(
            q, k, v, native_options(mask, args, sinks), bool(return_weights)))
    weights = weights if return_weights else None
    if single:
        out = out.squeeze(1)
        lse = lse.squeeze(1) if return_lse else None
        weights = None if weights is None else weights.squeeze(1)
    if out.dtype != query.dtype:
        out = out.to(query.dtype)
        weights = None if weights is None else weights.to(query.dtype)
    return _args.results(out, lse, weights, return_lse, return_weights)


_ORIGINAL = F.scaled_dot_product_attention
_warned = set()
# Where ``patch()`` sends calls with ``dropout_p > 0``: "attn" (its counter-based masks) or "torch".
DROPOUTS = ("attn", "torch")
_dropout = "attn"


def _warn_once(reason, detail):
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"attn: {detail}; using PyTorch's scaled_dot_product_attention", stacklevel=3)


def _unsupported(query, key, value, attn_mask, is_causal):
    """Why attn does not take this call (a short key), or None."""
    tensors = [t for t in (query, key, value, attn_mask) if t is not None]
    if any(t.device.type != "cpu" for t in tensors):
        return "device", "an input is not on the CPU"
    if any(t.dtype not in STORAGE for t in (query, key, value)) or not query.dtype == key.dtype == value.dtype:
        return "dtype", f"dtypes {query.dtype}, {key.dtype}, {value.dtype}"
    if query.dim() not in (3, 4) or not query.dim() == key.dim() == value.dim():
        return "rank", f"ranks {query.dim()}, {key.dim()}, {value.dim()} (attn takes 3 or 4)"
    if attn_mask is not None and is_causal:
        return "mask+causal", "attn_mask together with is_causal (PyTorch refuses it)"
    if attn_mask is not None and attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
        return "mask dtype", f"attn_mask of {attn_mask.dtype} with {query.dtype} inputs (PyTorch refuses it)"
    return None


def _causal_bias(bias, query, key, is_causal):
    """PyTorch's ``CausalBias`` (``torch.nn.attention.bias.causal_upper_left`` /
    ``causal_lower_right``) as attn's causal alignment, or None where its sizes are not the
    inputs' (PyTorch's own dispatch then decides, and raises its errors). Raises PyTorch's
    ``ValueError`` for ``is_causal=True``."""
    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True")
    if bias.seq_len_q == bias.seq_len_kv or bias.variant == CausalVariant.UPPER_LEFT:
        # PyTorch runs these as ``is_causal=True``, whatever the inputs' lengths.
        return "top-left"
    if (bias.seq_len_q, bias.seq_len_kv) != (query.shape[-2], key.shape[-2]):
        return None
    return "bottom-right"


def _routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kw):
    align = "top-left"
    if isinstance(attn_mask, CausalBias) and not kw:
        mapped = _causal_bias(attn_mask, query, key, is_causal)
        if mapped is not None:
            align, attn_mask, is_causal = mapped, None, True
    # A tensor subclass (or a torch-function mode) decides what the call means, as it would for
    # PyTorch's own function: it re-enters here with plain tensors or answers itself.
    relevant = tuple(t for t in (query, key, value, attn_mask) if t is not None)
    if has_torch_function(relevant):
        return handle_torch_function(
            _routed, relevant, query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa, **kw,
        )
    # ``dropout="torch"`` sends dropout to PyTorch as asked: no reason to warn.
    to_torch = bool(dropout_p) and _dropout == "torch"
    why = None if kw or to_torch else _unsupported(query, key, value, attn_mask, is_causal)
    if kw:
        why = "arguments", f"arguments {sorted(kw)}"
    if why is None and not to_torch:
        extras = dict(_args.NO_EXTRAS, align=align)
        try:
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extras)
        except (ValueError, TypeError, InternalError) as e:
            why = "refused", f"attn refused the call ({e})"
    if why is not None:
        _warn_once(*why)
    if align == "bottom-right":
        # Only ``CausalBias`` asks for it: PyTorch gets the mask it would have materialised.
        lq, lk = query.shape[-2], key.shape[-2]
        attn_mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(lk - lq)
        is_causal = False
    return _ORIGINAL(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
        enable_gqa=enable_gqa, **kw,
    )


_CAUSAL_TORCH_FUNCTION = CausalBias.__dict__["__torch_function__"]


@classmethod
def _causal_torch_function(cls, func, types, args=(), kwargs=None):
    """``CausalBias.__torch_function__`` while patched: it knows SDPA by identity with the
    module's attribute, which is then ``_routed``, so PyTorch's own function bound before the
    patch (``from torch.nn.functional import scaled_dot_product_attention``) would read the bias's
    raw storage; it is SDPA too."""
    if func is _ORIGINAL:
        func = F.scaled_dot_product_attention
    return _CAUSAL_TORCH_FUNCTION.__func__(cls, func, types, args, kwargs)


def patch(dropout="attn"):
    """Routes ``torch.nn.functional.scaled_dot_product_attention`` through attn (CPU tensors).

    ``dropout``: "attn" (default) runs ``dropout_p > 0`` through attn's fused dropout, whose masks
    are a pure function of a seed drawn from torch's generator (unbiased, thread-count
    independent, but not PyTorch's random stream); "torch" sends those calls to PyTorch, for code
    that needs PyTorch's dropout masks bit for bit (tests under ``freeze_rng_state``)."""
    global _dropout
    if dropout not in DROPOUTS:
        raise ValueError(f"dropout: {dropout!r}, expected one of {DROPOUTS}")
    _dropout = dropout
    F.scaled_dot_product_attention = _routed
    CausalBias.__torch_function__ = _causal_torch_function


def unpatch():
    """Restores PyTorch's ``scaled_dot_product_attention``."""
    F.scaled_dot_product_attention = _ORIGINAL
    CausalBias.__torch_function__ = _CAUSAL_TORCH_FUNCTION


@contextlib.contextmanager
def patched(dropout="attn"):
    """``with attn.torch.patched(): ...`` routes PyTorch's SDPA through attn inside the block
    (``dropout`` as for ``patch``)."""
    global _dropout
    previous, previous_dropout = F.scaled_dot_product_attention, _dropout
    previous_causal = CausalBias.__dict__["__torch_function__"]
    patch(dropout)
    try:
        yield
    finally:
        F.scaled_dot_product_attention, _dropout = previous, previous_dropout
        CausalBias.__torch_function__ = previous_causal
