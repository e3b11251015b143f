"""Inside ``attn.torch.patch()`` PyTorch's behaviour is the contract: what PyTorch's own SDPA test
suite (``test/test_transformers.py``) found different, one test per cause — empty and degenerate
sizes (``Dk = 0``, ``Dv = 0``, ``B = 0``, ``Lq = 0``, ``Lk = 0``), PyTorch's ``CausalBias`` masks in
eager mode and under ``torch.compile``, PyTorch's errors (type and message), dropout routed to
PyTorch on request, and a defect in the kernels reaching Python as an exception, never a panic."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import attn
import attn.torch
from attn import _attn

ORIGINAL = attn.torch._ORIGINAL


@pytest.fixture
def patched():
    """The patch for one test, with its warnings silenced (they are the fallback's, tested apart)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with attn.torch.patched():
            yield


def counted(monkeypatch):
    """Counts the calls that reach attn's kernels (``attn.torch.sdpa``) through the patch."""
    calls = []
    inner = attn.torch.sdpa
    monkeypatch.setattr(attn.torch, "sdpa", lambda *a: calls.append(1) or inner(*a))
    return calls


def qkv(b, h, lq, lk, dk, dv, dtype=torch.float32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=dtype).requires_grad_(grad)  # noqa: E731
    return make(b, h, lq, dk), make(b, h, lk, dk), make(b, h, lk, dv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_zero_qk_head_dim_gives_the_mean_of_the_values(dtype, patched, monkeypatch):
    calls = counted(monkeypatch)
    q, k, v = qkv(2, 3, 5, 7, 0, 4, dtype)
    want = v.float().mean(-2, keepdim=True).expand(2, 3, 5, 4)
    for out in (attn.sdpa(q, k, v), F.scaled_dot_product_attention(q, k, v)):
        assert out.shape == (2, 3, 5, 4) and out.dtype == dtype
        torch.testing.assert_close(out.float(), want, atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=0)
    assert calls, "the patched call reached attn"


def test_zero_qk_head_dim_with_a_causal_mask_averages_the_allowed_values(patched):
    q, k, v = qkv(1, 2, 4, 4, 0, 3, grad=True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    counts = torch.arange(1, 5, dtype=torch.float32)[:, None]
    torch.testing.assert_close(out, v.cumsum(-2) / counts)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    torch.testing.assert_close(v.grad, (1 / counts).flip(0).cumsum(0).flip(0).expand(1, 2, 4, 3))


@pytest.mark.parametrize(
    "shape",
    [(0, 2, 5, 7, 4, 4), (2, 2, 0, 7, 4, 4), (2, 2, 5, 0, 4, 4), (2, 2, 5, 7, 4, 0), (2, 0, 5, 7, 4, 4)],
    ids=["B=0", "Lq=0", "Lk=0", "Dv=0", "H=0"],
)
def test_empty_sizes_forward_and_backward_as_pytorch(shape, patched):
    q, k, v = qkv(*shape, grad=True)
    out = F.scaled_dot_product_attention(q, k, v)
    want = ORIGINAL(q, k, v)
    assert out.shape == want.shape
    torch.testing.assert_close(out, want)
    out.sum().backward()
    grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want.sum().backward()
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape
        torch.testing.assert_close(g, t.grad)


def test_empty_output_with_zero_strides_takes_its_gradient():
    q, k, v = qkv(0, 2, 5, 7, 4, 4, grad=True)
    out = attn.sdpa(q, k, v)
    out.backward(torch.empty_like(out).as_strided(out.shape, (0, 0, 0, 0)))
    assert q.grad.shape == q.shape


@pytest.mark.parametrize("lq,lk", [(6, 6), (4, 9), (9, 4)])
@pytest.mark.parametrize("variant", [causal_upper_left, causal_lower_right], ids=["upper_left", "lower_right"])
def test_causal_bias_is_pytorchs_causal_alignment(variant, lq, lk, patched, monkeypatch):
    calls = counted(monkeypatch)
    q, k, v = qkv(2, 2, lq, lk, 8, 8, grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bias = variant(lq, lk)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert calls, "the call reached attn"
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(0 if variant is causal_upper_left else lk - lq)
    want = ORIGINAL(q64, k64, v64, attn_mask=allowed)
    # PyTorch's math path gives NaN where a lower-right row has no key; attn (and the contract of
    # masked rows) gives 0.
    want = torch.nan_to_num(want, nan=0.0)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    want.sum().backward()
    for t, t64 in zip((q, k, v), (q64, k64, v64)):
        torch.testing.assert_close(t.grad.double(), torch.nan_to_num(t64.grad), atol=1e-4, rtol=1e-4)


def test_causal_bias_under_torch_compile(patched):
    q, k, v = qkv(1, 2, 4, 9, 8, 8)
    bias = causal_lower_right(4, 9)
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), fullgraph=False)
    allowed = torch.ones(4, 9, dtype=torch.bool).tril(5)
    torch.testing.assert_close(fn(q, k, v), ORIGINAL(q, k, v, attn_mask=allowed), atol=1e-5, rtol=1e-5)


def test_causal_bias_with_is_causal_raises_pytorchs_error(patched):
    q, k, v = qkv(1, 1, 4, 4, 8, 8)
    with pytest.raises(ValueError, match="CausalBias should not be used with causal=True"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(4, 4), is_causal=True)


class Scaled(torch.Tensor):
    """A tensor subclass whose ``__torch_function__`` gives SDPA a meaning of its own: it doubles the
    output (as a wrapper such as a quantized or logging tensor might change the call)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            plain = [a.as_subclass(torch.Tensor) if isinstance(a, Scaled) else a for a in args]
            return 2 * func(*plain, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


def test_a_tensor_subclass_decides_through_torch_function(patched):
    q, k, v = qkv(1, 2, 4, 4, 8, 8)
    out = F.scaled_dot_product_attention(q.as_subclass(Scaled), k, v)
    torch.testing.assert_close(out.as_subclass(torch.Tensor), 2 * ORIGINAL(q, k, v), atol=1e-5, rtol=1e-5)


def _errors():
    """Calls PyTorch refuses, as ``(name, thunk)``: each must raise PyTorch's error, type and
    message, through the patch."""
    q, k, v = qkv(2, 4, 5, 7, 8, 8)
    keep = torch.ones(5, 7, dtype=torch.bool)
    return [
        ("mask with is_causal", lambda f: f(q, k, v, attn_mask=keep, is_causal=True)),
        ("dtypes differ", lambda f: f(q, k.double(), v)),
        ("mask dtype", lambda f: f(q, k, v, attn_mask=torch.zeros(5, 7, dtype=torch.float64))),
        ("integer mask", lambda f: f(q, k, v, attn_mask=torch.zeros(5, 7, dtype=torch.int64))),
        ("mask shape", lambda f: f(q, k, v, attn_mask=torch.ones(3, 7, dtype=torch.bool))),
        ("head dims", lambda f: f(q, k[..., :4], v)),
        ("batch", lambda f: f(q, k[:1], v[:1])),
        ("kv lengths", lambda f: f(q, k, v[:, :, :6])),
        ("heads without enable_gqa", lambda f: f(q, k[:, :2], v[:, :2])),
        ("heads not a multiple", lambda f: f(q, k[:, :3], v[:, :3], enable_gqa=True)),
        ("rank 2", lambda f: f(q[0, 0], k[0, 0], v[0, 0])),
        ("rank mismatch", lambda f: f(q, k[0], v[0])),
        ("integer inputs", lambda f: f(q.long(), k.long(), v.long())),
        ("dropout above 1", lambda f: f(q, k, v, dropout_p=1.5)),
        ("negative dropout", lambda f: f(q, k, v, dropout_p=-0.1)),
    ]


@pytest.mark.parametrize("name,call", _errors(), ids=[e[0] for e in _errors()])
def test_errors_are_pytorchs(name, call):
    try:
        call(ORIGINAL)
    except Exception as e:  # noqa: BLE001 - the error PyTorch raises, whatever it is
        want = e
    else:
        # PyTorch answers this call: so must the patch, with PyTorch's result.
        want = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with attn.torch.patched():
            if want is None:
                torch.testing.assert_close(call(F.scaled_dot_product_attention), call(ORIGINAL), equal_nan=True)
                return
            with pytest.raises(type(want)) as got:
                call(F.scaled_dot_product_attention)
    assert str(got.value) == str(want), f"{name}: {got.value!r} instead of PyTorch's {want!r}"


def test_dropout_torch_gives_pytorchs_masks_bit_for_bit():
    q, k, v = qkv(2, 2, 6, 6, 8, 8)
    torch.manual_seed(3)
    want = ORIGINAL(q, k, v, dropout_p=0.3)
    with attn.torch.patched(dropout="torch"):
        torch.manual_seed(3)
        got = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    assert torch.equal(got, want)
    with attn.torch.patched():
        torch.manual_seed(3)
        ours = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    assert not torch.equal(ours, want), "the default runs attn's own dropout"


def test_dropout_choice_is_checked_and_restored():
    with pytest.raises(ValueError, match="dropout"):
        attn.torch.patch(dropout="numpy")
    with attn.torch.patched(dropout="torch"):
        assert attn.torch._dropout == "torch"
    assert attn.torch._dropout == "attn" and F.scaled_dot_product_attention is ORIGINAL


def test_a_panic_in_the_kernels_is_a_runtime_error_not_an_unwinding():
    with pytest.raises(_attn.InternalError, match="internal error"):
        _attn.panic_for_tests()
    assert issubclass(_attn.InternalError, RuntimeError)


def test_causal_bias_through_pytorchs_function_bound_before_the_patch(patched):
    # PyTorch's own function, as code that imported it before the patch holds it.
    bound = ORIGINAL
    q, k, v = qkv(2, 3, 8, 12, 16, 16)
    for variant, diagonal in ((causal_upper_left, 0), (causal_lower_right, 4)):
        allowed = torch.ones(8, 12, dtype=torch.bool).tril(diagonal)
        torch.testing.assert_close(bound(q, k, v, attn_mask=variant(8, 12)), ORIGINAL(q, k, v, attn_mask=allowed))


def test_one_key_value_head_broadcasts_without_enable_gqa(patched, monkeypatch):
    calls = counted(monkeypatch)
    q, k, v = qkv(2, 4, 5, 7, 8, 8)
    k1, v1 = k[:, :1], v[:, :1]
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k1, v1), ORIGINAL(q, k1, v1), atol=1e-5, rtol=1e-5)
    assert calls, "attn took the call"


def test_dropout_torch_keeps_a_lower_right_causal_bias():
    q, k, v = qkv(1, 2, 4, 9, 8, 8)
    bias = causal_lower_right(4, 9)
    torch.manual_seed(5)
    want = ORIGINAL(q, k, v, attn_mask=bias, dropout_p=0.3)
    with attn.torch.patched(dropout="torch"):
        torch.manual_seed(5)
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.3)
    torch.testing.assert_close(got, want)
