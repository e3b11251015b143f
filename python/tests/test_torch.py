"""attn.sdpa on PyTorch CPU tensors: forward and gradients against float64 under the team's rule,
every dtype, gradcheck of the float64 path (dropout replayed included), the operators under
``torch.library.opcheck`` and ``torch.compile``, and ``patch()`` with its fallback."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_oracle

import attn
import attn.torch as attn_torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tensors(b=2, hq=4, hkv=2, lq=9, lk=12, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
                 for shape in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))


def grads(fn, q, k, v, mask=None, **kw):
    """Output and gradients of ``sum(out * w)`` with a fixed ``w``."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, attn_mask=mask, enable_gqa=True, **kw)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * w).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


MASKS = {
    "none": lambda: None,
    "causal": lambda: "causal",
    "bool": lambda: torch.rand(2, 1, 9, 12, generator=torch.Generator().manual_seed(1)) > 0.3,
    "float": lambda: torch.randn(9, 12, generator=torch.Generator().manual_seed(2)),
}


@pytest.mark.parametrize("mask", MASKS)
def test_forward_and_gradients_match_float64(mask):
    m = MASKS[mask]()
    kw = {"is_causal": True} if isinstance(m, str) else {"mask": m}
    q, k, v = tensors()
    fast = grads(attn.sdpa, q, k, v, **kw)
    ref64 = grads(F.scaled_dot_product_attention, q.double(), k.double(), v.double(),
                  **({"mask": m.double() if m.is_floating_point() else m} if "mask" in kw and m is not None else kw))
    naive32 = grads(F.scaled_dot_product_attention, q, k, v, **kw)
    for i, name in enumerate(["out", "dq", "dk", "dv"]):
        assert_oracle(fast[i], naive32[i], ref64[i], k=2 if i == 0 else 3, floor=1e-6, what=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_comes_back_in_its_own_type(dtype):
    q, k, v = tensors(dtype=dtype)
    out, dq, dk, dv = grads(attn.sdpa, q, k, v, is_causal=True)
    ref = grads(F.scaled_dot_product_attention, q.double(), k.double(), v.double(), is_causal=True)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 3e-3, torch.bfloat16: 3e-2}[dtype]
    for got, want in zip((out, dq, dk, dv), ref):
        assert got.dtype == dtype
        assert (got.double() - want).abs().max() < tol * 5


def test_float64_gradients_pass_gradcheck_with_dropout_replayed():
    q, k, v = (t.requires_grad_() for t in tensors(b=1, hq=2, hkv=1, lq=5, lk=6, d=4, dtype=torch.float64))
    bias = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, bias):
        return attn.sdpa(q, k, v, attn_mask=bias, enable_gqa=True, dropout_p=0.3, seed=11, softcap=3.0)

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


def test_float64_gradients_pass_gradcheck_with_batched_gradients():
    """``vmap`` over the backward (gradcheck's batched-gradient check, as PyTorch's own SDPA tests
    run it) reaches the operators, not the kernels with storage-less tensors."""
    q, k, v = (t.requires_grad_() for t in tensors(b=1, hq=2, hkv=2, lq=4, lk=5, d=4, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda q, k, v: attn.sdpa(q, k, v, is_causal=True), (q, k, v), check_batched_grad=True)


def test_float64_lse_and_weights_pass_gradcheck():
    q, k, v = (t.requires_grad_() for t in tensors(b=1, hq=2, hkv=1, lq=5, lk=6, d=4, dtype=torch.float64))
    bias = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, bias):
        return attn.sdpa(q, k, v, attn_mask=bias, enable_gqa=True, dropout_p=0.3, seed=11, softcap=3.0,
                         return_lse=True, return_weights=True)

    assert torch.autograd.gradcheck(f, (q, k, v, bias))


def _formula(q, k, v, bias):
    """``(out, lse, weights)`` of attention written in PyTorch ops, grouped heads repeated."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1), torch.softmax(s, -1)


def _side_grads(fn, q, k, v, bias):
    """Gradients of q, k, v, bias of a loss on all three of ``fn``'s outputs."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    g = torch.Generator().manual_seed(5)
    loss = sum((x * torch.randn(x.shape, generator=g, dtype=torch.float64).to(x.dtype)).sum() for x in fn(*leaves))
    loss.backward()
    return [t.grad for t in leaves]


def test_lse_and_weights_gradients_match_float64():
    q, k, v = tensors()
    bias = torch.randn(9, 12, generator=torch.Generator().manual_seed(4))

    def ours(q, k, v, bias):
        return attn.sdpa(q, k, v, attn_mask=bias, enable_gqa=True, return_lse=True, return_weights=True)

    fast = _side_grads(ours, q, k, v, bias)
    ref64 = _side_grads(_formula, *(t.double() for t in (q, k, v, bias)))
    naive32 = _side_grads(_formula, q, k, v, bias)
    for name, f, n, r in zip(["dq", "dk", "dv", "dbias"], fast, naive32, ref64):
        assert_oracle(f, n, r, k=3, floor=1e-6, what=name)


def _with_sinks(q, k, v, sinks, causal):
    """gpt-oss's formula: each head's sink logit joins the softmax as an extra column, dropped after."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    column = sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, column], -1), -1)[..., :-1]
    return p @ v


@pytest.mark.parametrize("causal", [False, True])
def test_sinks_and_their_gradient_match_float64(causal):
    q, k, v = tensors()
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(6))

    def run(fn, *xs):
        leaves = [t.detach().clone().requires_grad_() for t in xs]
        out = fn(*leaves)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
        return [out.detach()] + [t.grad for t in leaves]

    fast = run(lambda q, k, v, s: attn.sdpa(q, k, v, is_causal=causal, enable_gqa=True, sinks=s), q, k, v, sinks)
    ref64 = run(lambda *xs: _with_sinks(*xs, causal), q.double(), k.double(), v.double(), sinks.double())
    naive32 = run(lambda *xs: _with_sinks(*xs, causal), q, k, v, sinks)
    for i, name in enumerate(["out", "dq", "dk", "dv", "dsinks"]):
        assert_oracle(fast[i], naive32[i], ref64[i], k=2 if i == 0 else 3, floor=1e-6, what=name)
    with torch.no_grad():
        untracked = attn.sdpa(q, k, v, is_causal=causal, enable_gqa=True, sinks=sinks)
    numpy = attn.sdpa(q.numpy(), k.numpy(), v.numpy(), is_causal=causal, enable_gqa=True, sinks=sinks.numpy())
    torch.testing.assert_close(untracked, fast[0], rtol=0, atol=0)
    np.testing.assert_array_equal(numpy, fast[0].numpy())


def test_sinks_of_the_wrong_shape_are_refused():
    q, k, v = tensors()
    with pytest.raises(ValueError, match="sinks"):
        attn.sdpa(q, k, v, enable_gqa=True, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks"):
        attn.sdpa(q.numpy(), k.numpy(), v.numpy(), enable_gqa=True, sinks=np.zeros(3, dtype=np.float32))


def test_float_mask_gradient_matches_pytorch():
    q, k, v = tensors()
    out = {}
    for name, fn in (("attn", attn.sdpa), ("torch", F.scaled_dot_product_attention)):
        bias = torch.randn(2, 1, 9, 12, generator=torch.Generator().manual_seed(3), requires_grad=True)
        fn(q, k, v, attn_mask=bias, enable_gqa=True).square().sum().backward()
        out[name] = bias.grad
    assert (out["attn"] - out["torch"]).abs().max() < 1e-5


def test_results_are_tensors_sharing_the_kernel_buffers():
    q, k, v = tensors()
    out, lse, w = attn.sdpa(q, k, v, enable_gqa=True, return_lse=True, return_weights=True)
    assert isinstance(out, torch.Tensor) and lse.shape == (2, 4, 9) and w.shape == (2, 4, 9, 12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9))
    torch.testing.assert_close(lse, torch.logsumexp(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4, -1))


def test_transposed_inputs_are_read_in_place():
    x = [torch.randn(2, 9, 4, 16) for _ in range(3)]
    strided = [t.transpose(1, 2) for t in x]
    assert not strided[0].is_contiguous()
    torch.testing.assert_close(attn.sdpa(*strided), attn.sdpa(*(t.contiguous() for t in strided)), rtol=0, atol=0)


def test_opcheck_passes():
    q, k, v = tensors()
    bias = torch.randn(9, 12)
    keep = torch.rand(2, 1, 9, 12) > 0.2
    sinks = torch.randn(4)
    cases = ((None, True, "f32", False, None), (keep, False, "f32", True, None), (bias, False, "f32", True, sinks),
             (None, True, "bf16", False, sinks))
    for mask, causal, compute, weights, s in cases:
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        s = None if s is None else s.clone().requires_grad_()
        args = (qq, kk, vv, mask, 0.0, causal, None, [4, -1], None, False, None, 0, compute, weights, s)
        torch.library.opcheck(torch.ops.attn.sdpa_forward.default, args)


def test_torch_compile_matches_eager():
    q, k, v = tensors()

    def step(q, k, v):
        return attn.sdpa(q, k, v, is_causal=True, enable_gqa=True).sin().sum()

    compiled = torch.compile(step, fullgraph=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled(*leaves).backward()
    step(*eager_leaves).backward()
    for a, b in zip(leaves, eager_leaves):
        torch.testing.assert_close(a.grad, b.grad)


def test_dropout_draws_its_seed_from_torch():
    q, k, v = tensors()
    torch.manual_seed(7)
    a = attn.sdpa(q, k, v, dropout_p=0.5, enable_gqa=True)
    torch.manual_seed(7)
    b = attn.sdpa(q, k, v, dropout_p=0.5, enable_gqa=True)
    c = attn.sdpa(q, k, v, dropout_p=0.5, enable_gqa=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert (a - c).abs().max() > 1e-3


BAD = [
    ("device", lambda q, k, v: attn.sdpa(q.to("meta"), k, v), ValueError, "CPU"),
    ("dtype", lambda q, k, v: attn.sdpa(q.int(), k, v), TypeError, "dtype"),
    ("mixed", lambda q, k, v: attn.sdpa(q, k.double(), v), TypeError, "differ"),
    ("shape", lambda q, k, v: attn.sdpa(q, k[:, :, :3], v), ValueError, "dimension length"),
    ("last dim", lambda q, k, v: attn.sdpa(q[..., ::2], k[..., ::2], v), ValueError, "last dimension"),
    ("mask", lambda q, k, v: attn.sdpa(q, k, v, attn_mask=torch.ones(3, 12, dtype=torch.bool)), ValueError, "mask"),
    ("mask dtype", lambda q, k, v: attn.sdpa(q, k, v, attn_mask=torch.ones(9, 12, dtype=torch.int64)), TypeError, "attn_mask"),
    ("gqa", lambda q, k, v: attn.sdpa(q, k[:, :2], v[:, :2]), ValueError, "enable_gqa"),
]


@pytest.mark.parametrize("name,call,error,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises(name, call, error, text):
    q, k, v = tensors(hq=4, hkv=4)
    with pytest.raises(error, match=text):
        call(q, k, v)


def test_patch_routes_and_falls_back_with_one_warning():
    q, k, v = tensors(hq=4, hkv=4)
    calls = []
    original = attn_torch.sdpa

    def spy(*a, **kw):
        calls.append(1)
        return original(*a, **kw)

    attn_torch.sdpa = spy
    try:
        with attn_torch.patched():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert len(calls) == 1
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                attn_torch._warned.clear()
                x = torch.randn(1, 1, 2, 3, 4)  # rank 5: PyTorch's
                F.scaled_dot_product_attention(x, x, x)
                F.scaled_dot_product_attention(x, x, x)
            assert len(calls) == 1 and len(seen) == 1 and "rank" in str(seen[0].message)
        assert F.scaled_dot_product_attention is attn_torch._ORIGINAL
    finally:
        attn_torch.sdpa = original
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    np.testing.assert_array_equal(out.numpy(), attn.sdpa(q, k, v, is_causal=True).numpy())
