"""``compute="bf16"``: bfloat16 products with float32 accumulation, against the float64 oracle under
the team's rule with PyTorch's bfloat16 math path as the baseline error (every materialised tensor
rounded to bfloat16: scores, probabilities, output), on inputs that hold bfloat16 values, as
``crates/attn-kernels/tests/bf16_compute.rs`` checks the kernels; through NumPy arrays, float32
tensors and bfloat16 tensors (read as bfloat16 through DLPack), and under autograd."""

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


def test_bf16_products_under_autograd(rng):
    q, k, v = (torch.from_numpy(x).requires_grad_() for x in inputs(rng))
    out = attn.sdpa(q, k, v, is_causal=True, enable_gqa=True, compute="bf16")
    with torch.no_grad():
        direct = attn.sdpa(q, k, v, is_causal=True, enable_gqa=True, compute="bf16")
    torch.testing.assert_close(out, direct, rtol=0, atol=0)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v))


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
