"""``compute="bf16"``: bfloat16 products with float32 accumulation, against the float64 oracle under
the team's rule with PyTorch's bfloat16 math path as the baseline error (every materialised tensor
rounded to bfloat16: scores, probabilities, output), on inputs that hold bfloat16 values, as
``crates/attn-kernels/tests/bf16_compute.rs`` checks the kernels; through NumPy arrays, float32
tensors and bfloat16 tensors (read as bfloat16 through DLPack), and the gradients (bf16 products in
the backward too) against PyTorch's bf16 math path written out."""

import numpy as np
import pytest
import torch
from conftest import assert_oracle, naive

import attn


def round_bf16(x):
    """``x`` (float32) rounded to the nearest bfloat16, ties to even, as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def math_bf16(q, k, v, keep=None, causal=False, scale=None):
    """PyTorch's math path in bfloat16: scores ``bf16(bf16(q·k)·scale)``, softmax in float32
    rounded to bf16, ``out = bf16(Σ p·v)``."""
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    scale = np.float32(1 / np.sqrt(d) if scale is None else scale)
    s = round_bf16(round_bf16(np.einsum("bhid,bhjd->bhij", q, k)) * scale)
    allowed = np.ones(s.shape, dtype=bool)
    if causal:
        allowed &= np.arange(lk)[None, :] <= np.arange(lq)[:, None]
    if keep is not None:
        allowed &= np.broadcast_to(keep, allowed.shape)
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = round_bf16(e / e.sum(-1, keepdims=True))
    return round_bf16(np.einsum("bhij,bhjd->bhid", p, v))


def inputs(rng, b=2, hq=4, hkv=2, lq=40, lk=70, d=32):
    """q, k, v holding bfloat16 values, as float32 arrays."""
    return tuple(
        round_bf16(rng.standard_normal((b, h, n, d), dtype=np.float32)) for h, n in ((hq, lq), (hkv, lk), (hkv, lk))
    )


CASES = [dict(), dict(causal=True), dict(keep=True)]


def case_masks(rng, case, lq=40, lk=70):
    keep = rng.random((2, 1, lq, lk)) > 0.3 if case.get("keep") else None
    return keep, case.get("causal", False)


@pytest.mark.parametrize("case", CASES, ids=["full", "causal", "keep-mask"])
@pytest.mark.parametrize("kind", ["numpy", "float32 tensors", "bfloat16 tensors"])
def test_bf16_products_meet_the_oracle_rule(rng, case, kind):
    q, k, v = inputs(rng)
    keep, causal = case_masks(rng, case)
    ref64 = naive(q, k, v, keep=keep, causal=causal)
    base = math_bf16(q, k, v, keep=keep, causal=causal)
    if kind == "numpy":
        out = attn.sdpa(q, k, v, attn_mask=keep, is_causal=causal, enable_gqa=True, compute="bf16")
    else:
        dtype = torch.float32 if kind == "float32 tensors" else torch.bfloat16
        t = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
        mask = None if keep is None else torch.from_numpy(keep)
        out = attn.sdpa(*t, attn_mask=mask, is_causal=causal, enable_gqa=True, compute="bf16")
        assert out.dtype == dtype
        out = out.float().numpy()
    assert_oracle(out, base, ref64, k=2.0)


def test_bf16_products_really_run(rng):
    q, k, v = inputs(rng, b=1, hq=2, hkv=2, lq=64, lk=128, d=64)
    assert not np.array_equal(attn.sdpa(q, k, v, compute="bf16"), attn.sdpa(q, k, v))


def math_path(q, k, v, grad, causal, dtype):
    """PyTorch's math path written out in ``dtype`` (every materialised tensor rounded to it, the
    softmax taken in float32, or float64 for float64), with its gradients for the output gradient
    ``grad``: ``(out, dq, dk, dv)`` as float64 arrays."""
    q, k, v = (torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ kk.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.softmax(s.to(acc), -1).to(dtype) @ vv
    out.backward(grad.to(dtype))
    return [t.detach().double().numpy() for t in (out, q.grad, k.grad, v.grad)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_products_gradients_meet_the_oracle_rule(rng, causal):
    q, k, v = inputs(rng)
    grad = torch.from_numpy(round_bf16(rng.standard_normal((2, 4, 40, 32), dtype=np.float32)))
    ref64 = math_path(q, k, v, grad, causal, torch.float64)
    base = math_path(q, k, v, grad, causal, torch.bfloat16)
    t = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    out = attn.sdpa(*t, is_causal=causal, enable_gqa=True, compute="bf16")
    out.backward(grad)
    fast = [out.detach().numpy()] + [x.grad.numpy() for x in t]
    for name, f, b, r, factor in zip(["out", "dq", "dk", "dv"], fast, base, ref64, [2, 3, 3, 3]):
        assert_oracle(f, b, r, k=factor, what=name)
    with torch.no_grad():
        direct = attn.sdpa(*t, is_causal=causal, enable_gqa=True, compute="bf16")
    torch.testing.assert_close(out, direct, rtol=0, atol=0)
    # The backward operator itself computes with bf16 products: on the same saved forward, its
    # gradients differ from its f32 products' ones.
    qq, kk, vv = (x.detach() for x in t)
    options = (0.0, causal, None, None, None, False, None, 0)
    out, lse, res, _ = torch.ops.attn.sdpa_forward(qq, kk, vv, None, *options, "bf16")
    grads = {
        c: torch.ops.attn.sdpa_backward(grad, qq, kk, vv, out, lse, res, None, False, *options, c)
        for c in ("bf16", "f32")
    }
    assert all(not torch.equal(a, b) for a, b in zip(grads["bf16"][:3], grads["f32"][:3]))


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda q: attn.sdpa(q, q, q, compute="f16"), ValueError, "compute"),
        (lambda q: attn.sdpa(q.astype(np.float64), q.astype(np.float64), q.astype(np.float64), compute="bf16"),
         ValueError, "float64"),
        (lambda q: attn.sdpa(*(torch.from_numpy(q).double(),) * 3, compute="bf16"), ValueError, "float64"),
    ],
    ids=["unknown", "numpy float64", "tensor float64"],
)
def test_bad_compute_is_refused(rng, call, error, message):
    q = rng.standard_normal((1, 2, 8, 16), dtype=np.float32)
    with pytest.raises(error, match=message):
        call(q)
