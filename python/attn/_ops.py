"""attn's attention as PyTorch operators: ``attn::sdpa_forward`` and ``attn::sdpa_backward``
(``torch.library.define``, their schemas made from one list of options, ``OPTIONS``), with fake
(meta) implementations for ``torch.compile`` and the autograd formula that runs the fused backward
kernel on the forward's saved log-sum-exp, replaying dropout from its seed.

The operators take 4-D CPU tensors: ``q: [B, Hq, Lq, Dk]`` in the compute type (float32, or
float64), ``k: [B, Hkv, Lk, Dk]`` and ``v: [B, Hkv, Lk, Dv]`` in float32, float16 or bfloat16
(float64 with float64 queries), last dimension contiguous, read in place through DLPack.
``attn_mask`` is a C-contiguous bool keep-mask or a float bias in the compute type, broadcast to
``[B, Hq, Lq, Lk]``. ``window`` is ``[left, right]`` with -1 for an unbounded side. ``compute``
is ``"f32"`` or ``"bf16"`` (bfloat16 products, forward and backward).
The forward returns ``out: [B, Hq, Lq, Dv]`` (compute type), ``lse`` and ``lse_residue``
``[B, Hq, Lq]`` and, with ``want_weights``, the weights before dropout ``[B, Hq, Lq, Lk]`` (else an
empty tensor). ``out``, ``lse`` and the weights are differentiable: the backward runs once with every
gradient that arrived (``dS = A∘(dA + dW − Δ − ω + dlse)``, see the Rust ``SideGrads``).
"""

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _attn

STORAGE = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# The options both operators take, in this order, with their schema types: spelled once here,
# for the schemas, the native options dictionary and the autograd context alike.
OPTIONS = (
    ("dropout_p", "float"),
    ("is_causal", "bool"),
    ("scale", "float?"),
    ("window", "int[]?"),
    ("softcap", "float?"),
    ("bottom_right", "bool"),
    ("key_lengths", "int[]?"),
    ("seed", "int"),
    ("compute", "str"),
)
N_OPTIONS = len(OPTIONS)
_SCHEMA_OPTIONS = ", ".join(f"{kind} {name}" for name, kind in OPTIONS)
FORWARD_SCHEMA = (
    f"(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, {_SCHEMA_OPTIONS}, bool want_weights=False, "
    "Tensor? sinks=None) -> (Tensor, Tensor, Tensor, Tensor)"
)
BACKWARD_SCHEMA = (
    "(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor lse_residue, Tensor? attn_mask, "
    f"bool want_dbias, {_SCHEMA_OPTIONS}, Tensor? grad_lse=None, Tensor? weights=None, Tensor? grad_weights=None, "
    "Tensor? sinks=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def native_options(attn_mask, options, sinks=None):
    """The native module's options dictionary from the mask, the operators' ``options`` (the
    values of ``OPTIONS``, in order) and the sinks."""
    o = dict(zip((name for name, _ in OPTIONS), options, strict=True))
    keep = bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = to_dlpack(attn_mask)
        else:
            bias = to_dlpack(attn_mask)
    window = o["window"]
    return {
        "keep": keep,
        "bias": bias,
        "causal": o["is_causal"],
        "window": None if window is None else tuple(None if x < 0 else x for x in window),
        "bottom_right": o["bottom_right"],
        "key_lengths": o["key_lengths"],
        "scale": o["scale"],
        "softcap": o["softcap"],
        "dropout_p": o["dropout_p"],
        "seed": o["seed"],
        "bf16_products": o["compute"] == "bf16",
        "sinks": None if sinks is None else to_dlpack(sinks),
    }


def run_forward(q, k, v, opts, want_weights):
    """The native forward on tensors, read in place: ``(out, lse, lse_residue, weights or None)``
    as NumPy arrays owning the kernels' buffers (``torch.from_numpy`` shares them)."""
    return _attn.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), opts, want_weights)


def _tail(rest, defaults):
    """The options and the trailing arguments (with their defaults) of an operator's ``rest``."""
    options, tail = rest[:N_OPTIONS], rest[N_OPTIONS:]
    return options, tuple(tail) + defaults[len(tail):]


def forward_tensors(q, k, v, attn_mask, *rest):
    """The forward operator's computation (``FORWARD_SCHEMA``'s arguments and results), without
    the dispatcher."""
    options, (want_weights, sinks) = _tail(rest, (False, None))
    out, lse, res, weights = run_forward(q, k, v, native_options(attn_mask, options, sinks), want_weights)
    weights = q.new_empty(0) if weights is None else torch.from_numpy(weights)
    return torch.from_numpy(out), torch.from_numpy(lse), torch.from_numpy(res), weights


def backward_tensors(grad, q, k, v, out, lse, lse_residue, attn_mask, want_dbias, *rest):
    """The backward operator's computation (``BACKWARD_SCHEMA``'s arguments and results), without
    the dispatcher."""
    options, (grad_lse, weights, grad_weights, sinks) = _tail(rest, (None, None, None, None))
    opts = native_options(attn_mask, options, sinks)
    grad = grad.to(q.dtype)
    if grad.dim() == 4 and grad.shape[-1] > 1 and grad.stride(-1) != 1:
        grad = grad.contiguous()
    saved = (to_dlpack(out), to_dlpack(grad), to_dlpack(lse.contiguous()), to_dlpack(lse_residue.contiguous()))
    side = [None if x is None else to_dlpack(x.to(q.dtype).contiguous()) for x in (grad_lse, weights, grad_weights)]
    dq, dk, dv, dbias, dsinks = _attn.backward(to_dlpack(q), to_dlpack(k), to_dlpack(v), *saved, opts, want_dbias, *side)
    dbias = q.new_empty(0) if dbias is None else torch.from_numpy(dbias).reshape(attn_mask.shape)
    dsinks = q.new_empty(0) if dsinks is None else torch.from_numpy(dsinks)
    return torch.from_numpy(dq), torch.from_numpy(dk).to(k.dtype), torch.from_numpy(dv).to(v.dtype), dbias, dsinks


torch.library.define("attn::sdpa_forward", FORWARD_SCHEMA)
torch.library.define("attn::sdpa_backward", BACKWARD_SCHEMA)
torch.library.impl("attn::sdpa_forward", "cpu", forward_tensors)
torch.library.impl("attn::sdpa_backward", "cpu", backward_tensors)
sdpa_forward = torch.ops.attn.sdpa_forward.default
sdpa_backward = torch.ops.attn.sdpa_backward.default


@torch.library.register_fake("attn::sdpa_forward")
def _(q, k, v, attn_mask, *rest):
    _, (want_weights, _sinks) = _tail(rest, (False, None))
    lse = q.new_empty(q.shape[:-1])
    weights = q.new_empty((*q.shape[:-1], k.shape[-2])) if want_weights else q.new_empty(0)
    return q.new_empty((*q.shape[:-1], v.shape[-1])), lse, torch.empty_like(lse), weights


@torch.library.register_fake("attn::sdpa_backward")
def _(grad, q, k, v, out, lse, lse_residue, attn_mask, want_dbias, *rest):
    _, (_grad_lse, _weights, _grad_weights, sinks) = _tail(rest, (None, None, None, None))
    dbias = attn_mask.new_empty(attn_mask.shape) if want_dbias else q.new_empty(0)
    dsinks = q.new_empty(0) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias, dsinks


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, *rest = inputs
    out, lse, res, weights = output
    ctx.save_for_backward(q, k, v, out, lse, res, attn_mask, weights)
    # Outputs no loss read get ``None``, not zeros: the backward then takes no side gradient.
    ctx.set_materialize_grads(False)
    # The options both operators take; ``want_weights`` stays behind, the sinks (the forward's
    # last input, when given) are saved apart.
    ctx.options, (_want_weights, ctx.sinks) = _tail(rest, (False, None))
    ctx.inputs = len(inputs)
    ctx.want_dbias = attn_mask is not None and attn_mask.dtype != torch.bool and ctx.needs_input_grad[3]


def _gradients(backward, ctx, grad_out, grad_lse, grad_weights):
    """The forward's inputs' gradients through ``backward`` (the operator, or its computation)."""
    q, k, v, out, lse, res, attn_mask, weights = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    side = (grad_lse, None, None) if grad_weights is None or weights.numel() == 0 else (grad_lse, weights, grad_weights)
    dq, dk, dv, dbias, dsinks = backward(
        grad_out, q, k, v, out, lse, res, attn_mask, ctx.want_dbias, *ctx.options, *side, ctx.sinks
    )
    rest = [None] * (ctx.inputs - 4)
    if ctx.sinks is not None:
        rest[-1] = dsinks
    return (dq, dk, dv, dbias if ctx.want_dbias else None, *rest)


def _backward(ctx, grad_out, grad_lse, _grad_res, grad_weights):
    return _gradients(sdpa_backward, ctx, grad_out, grad_lse, grad_weights)


torch.library.register_autograd("attn::sdpa_forward", _backward, setup_context=_setup_context)


def storageless(*tensors):
    """Whether any of ``tensors`` has no storage: ``vmap``'s batched tensors (and ``gradcheck``'s
    batched-gradient check, which vmaps the backward), functorch's other wrappers. The kernels
    cannot read them; the operators can, which the dispatcher runs one slice at a time."""
    return any(t is not None and not torch._C._has_storage(t) for t in tensors)


class Eager(torch.autograd.Function):
    """The operators' autograd without the dispatcher, for eager calls on plain tensors: the same
    computation, saved tensors and backward (``sdpa_forward``'s arguments), tens of microseconds
    less per call on small tensors. ``torch.compile`` and functorch's transforms (``vmap`` over
    the inputs or the gradients) need the operators."""

    @staticmethod
    def forward(ctx, *inputs):
        output = forward_tensors(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse, _grad_res, grad_weights):
        wrapped = storageless(grad_out, grad_lse, grad_weights, *ctx.saved_tensors)
        return _gradients(sdpa_backward if wrapped else backward_tensors, ctx, grad_out, grad_lse, grad_weights)
