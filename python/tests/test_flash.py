"""``attn.flash_attn_func`` against FlashAttention's semantics written out in float64 (bottom-right
causal and window, softcap, ALiBi, grouped-query heads, ``Lq != Lk``): outputs, log-sum-exps and
gradients under the oracle rule, the probabilities, the layout, dropout's seed and bad input."""

import math

import pytest
import torch

import attn


def reference(q, k, v, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None):
    """FlashAttention's definition in q's dtype: ``[B, L, H, D]`` in and out, plus lse and probs."""
    b, lq, hq, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    kh = kh.repeat_interleave(hq // hkv, dim=1)
    vh = vh.repeat_interleave(hq // hkv, dim=1)
    s = qh @ kh.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(d))
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(lq).view(lq, 1) + (lk - lq)
    j = torch.arange(lk).view(1, lk)
    if alibi is not None:
        s = s - alibi.to(s.dtype).reshape(-1, hq, 1, 1) * (i - j).abs().to(s.dtype)
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (p @ vh).transpose(1, 2), lse, p


CASES = {
    "plain": dict(),
    "causal_bottom_right": dict(causal=True),
    "window": dict(window=(3, 2)),
    "causal_window_softcap": dict(causal=True, window=(4, -1), softcap=5.0),
    "alibi": dict(alibi=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flash_attn_func_matches_flash_attention_semantics(name):
    case = dict(CASES[name])
    g = torch.Generator().manual_seed(7)
    b, lq, lk, hq, hkv, d = 2, 5, 9, 4, 2, 8
    q64 = torch.randn(b, lq, hq, d, generator=g, dtype=torch.float64) * 1.5
    k64 = torch.randn(b, lk, hkv, d, generator=g, dtype=torch.float64) * 1.5
    v64 = torch.randn(b, lk, hkv, d, generator=g, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]) if case.pop("alibi", False) else None
    kwargs = dict(causal=case.get("causal", False), window_size=case.get("window", (-1, -1)),
                  softcap=case.get("softcap", 0.0), alibi_slopes=slopes)
    grad = torch.randn(b, lq, hq, d, generator=g, dtype=torch.float64)

    def run(fn, dtype):
        q, k, v = (t.detach().to(dtype).clone().requires_grad_() for t in (q64, k64, v64))
        out, lse, p = fn(q, k, v)
        (out * grad.to(dtype)).sum().backward()
        return out, lse, p, (q.grad, k.grad, v.grad)

    ref = run(lambda q, k, v: reference(q, k, v, causal=kwargs["causal"], window=kwargs["window_size"],
                                        softcap=kwargs["softcap"], alibi=slopes), torch.float64)
    naive = run(lambda q, k, v: reference(q, k, v, causal=kwargs["causal"], window=kwargs["window_size"],
                                          softcap=kwargs["softcap"], alibi=slopes), torch.float32)
    ours = run(lambda q, k, v: attn.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs), torch.float32)
    assert ours[0].shape == (b, lq, hq, d) and ours[0].is_contiguous()
    assert ours[1].shape == (b, hq, lq) and ours[2].shape == (b, hq, lq, lk)

    def check(what, fast, slow, exact, factor):
        finite = torch.isfinite(exact)
        err = (fast.double() - exact)[finite].abs().max().item()
        bound = factor * (slow.double() - exact)[finite].abs().max().item() + 1e-6
        assert err <= bound, f"{name} {what}: {err:.3g} > {bound:.3g}"

    check("out", ours[0], naive[0], ref[0], 2)
    check("lse", ours[1], naive[1], ref[1], 2)
    check("probs", ours[2], naive[2], ref[2], 2)
    for what, f, n, r in zip(("dq", "dk", "dv"), ours[3], naive[3], ref[3]):
        check(what, f, n, r, 3)
    # Without return_attn_probs only the output comes back.
    plain = attn.flash_attn_func(q64.float(), k64.float(), v64.float(), **kwargs)
    assert torch.equal(plain, ours[0].detach())


def test_dropout_draws_from_torch_and_bad_input_is_refused():
    q = torch.randn(1, 6, 2, 8)
    torch.manual_seed(3)
    a = attn.flash_attn_func(q, q, q, dropout_p=0.3)
    torch.manual_seed(3)
    b = attn.flash_attn_func(q, q, q, dropout_p=0.3)
    assert torch.equal(a, b) and not torch.equal(a, attn.flash_attn_func(q, q, q))
    with pytest.raises(ValueError, match="4-D"):
        attn.flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="alibi_slopes"):
        attn.flash_attn_func(q, q, q, alibi_slopes=torch.ones(3))
