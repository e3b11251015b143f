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


@pytest.mark.parametrize("name", ["plain", "causal_bottom_right", "causal_window_softcap", "alibi"])
def test_flash_attn_varlen_func_equals_each_sequence_alone(name):
    """Packed sequences of different lengths (one empty) against FlashAttention's definition per
    sequence: outputs, log-sum-exps ``[H, total_q]`` and gradients under the oracle rule."""
    case = dict(CASES[name])
    g = torch.Generator().manual_seed(11)
    lens_q, lens_k, hq, hkv, d = [3, 0, 6, 1], [7, 2, 6, 4], 4, 2, 8
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q64 = torch.randn(sum(lens_q), hq, d, generator=g, dtype=torch.float64) * 1.5
    k64 = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64) * 1.5
    v64 = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=torch.float64)
    grad = torch.randn(sum(lens_q), hq, d, generator=g, dtype=torch.float64)
    slopes = torch.rand(len(lens_q), hq, generator=g) if case.pop("alibi", False) else None
    opts = dict(causal=case.get("causal", False), window=case.get("window", (-1, -1)), softcap=case.get("softcap", 0.0))

    def per_sequence(q, k, v):
        outs, lses = [], []
        for b in range(len(lens_q)):
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            o, lse, _ = reference(q[qs][None], k[ks][None], v[ks][None], alibi=None if slopes is None else slopes[b],
                                  **opts)
            outs.append(o[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, dim=1)

    def run(fn, dtype):
        q, k, v = (t.detach().to(dtype).clone().requires_grad_() for t in (q64, k64, v64))
        out, lse = fn(q, k, v)
        (out * grad.to(dtype)).sum().backward()
        return out, lse, (q.grad, k.grad, v.grad)

    ref, naive = run(per_sequence, torch.float64), run(per_sequence, torch.float32)
    ours = run(lambda q, k, v: attn.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=opts["causal"], window_size=opts["window"],
        softcap=opts["softcap"], alibi_slopes=slopes, return_attn_probs=True)[:2], torch.float32)
    assert ours[0].shape == (sum(lens_q), hq, d) and ours[1].shape == (hq, sum(lens_q))
    for what, fast, slow, exact, factor in [("out", ours[0], naive[0], ref[0], 2), ("lse", ours[1], naive[1], ref[1], 2),
                                            *[(w, f, n, r, 3) for w, f, n, r in zip(("dq", "dk", "dv"), ours[2], naive[2], ref[2])]]:
        finite = torch.isfinite(exact)
        err = (fast.double() - exact)[finite].abs().max().item()
        bound = factor * (slow.double() - exact)[finite].abs().max().item() + 1e-6
        assert err <= bound, f"{name} {what}: {err:.3g} > {bound:.3g}"


def test_flash_attn_varlen_func_refuses_bad_offsets_and_paged_caches():
    q = torch.randn(5, 2, 8)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        attn.flash_attn_varlen_func(q, q, q, torch.tensor([0, 4, 3]), cu, 4, 3)
    with pytest.raises(ValueError, match="max_seqlen"):
        attn.flash_attn_varlen_func(q, q, q, cu, cu, 2, 3)
    with pytest.raises(ValueError, match="block_table"):
        attn.flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, block_table=torch.zeros(2, 1, dtype=torch.int32))


def test_flash_attn_with_kvcache_writes_new_keys_and_attends_each_sequence_to_its_length():
    """Dense and paged caches (pages of 4, shuffled, a sequence with an empty cache): the new keys
    land at ``cache_seqlens`` and nowhere else, the output equals FlashAttention's definition over
    each sequence's keys (oracle rule), and the paged cache gives the dense cache's output."""
    g = torch.Generator().manual_seed(5)
    b, cap, hq, hkv, d, lnew = 3, 16, 4, 2, 8, 2
    seqlens = torch.tensor([5, 0, 9], dtype=torch.int32)
    k_cache = torch.randn(b, cap, hkv, d, generator=g)
    v_cache = torch.randn(b, cap, hkv, d, generator=g)
    q = torch.randn(b, lnew, hq, d, generator=g)
    k_new, v_new = torch.randn(b, lnew, hkv, d, generator=g), torch.randn(b, lnew, hkv, d, generator=g)
    page = 4
    pages_per_seq = cap // page
    order = torch.randperm(b * pages_per_seq, generator=g)
    block_table = order.view(b, pages_per_seq).to(torch.int32)
    k_pages = torch.empty(b * pages_per_seq, page, hkv, d)
    v_pages = torch.empty_like(k_pages)
    for s in range(b):
        for p in range(pages_per_seq):
            k_pages[block_table[s, p]] = k_cache[s, p * page:(p + 1) * page]
            v_pages[block_table[s, p]] = v_cache[s, p * page:(p + 1) * page]
    before = k_cache.clone()
    out, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens,
                                            causal=True, return_softmax_lse=True)
    for s in range(b):
        n = int(seqlens[s])
        assert torch.equal(k_cache[s, n:n + lnew], k_new[s]) and torch.equal(v_cache[s, n:n + lnew], v_new[s])
        assert torch.equal(k_cache[s, :n], before[s, :n]) and torch.equal(k_cache[s, n + lnew:], before[s, n + lnew:])
        keys, values = k_cache[s:s + 1, :n + lnew].double(), v_cache[s:s + 1, :n + lnew].double()
        exact = reference(q[s:s + 1].double(), keys, values, causal=True)
        naive = reference(q[s:s + 1], keys.float(), values.float(), causal=True)
        for what, fast, slow, ref in (("out", out[s:s + 1], naive[0], exact[0]), ("lse", lse[s:s + 1], naive[1], exact[1])):
            err = (fast.double() - ref).abs().max().item()
            assert err <= 2 * (slow.double() - ref).abs().max().item() + 1e-6, f"sequence {s} {what}: {err}"
    paged = attn.flash_attn_with_kvcache(q, k_pages, v_pages, k=k_new, v=v_new, cache_seqlens=seqlens,
                                         block_table=block_table, causal=True)
    assert torch.equal(paged, out)
    for s in range(b):
        n = int(seqlens[s])
        for p in range(n, n + lnew):
            assert torch.equal(k_pages[block_table[s, p // page], p % page], k_new[s, p - n])


def test_flash_attn_with_kvcache_refuses_what_does_not_fit():
    q = torch.randn(1, 1, 2, 8)
    cache = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="cache_seqlens"):
        attn.flash_attn_with_kvcache(q, cache, cache, k=q, v=q, cache_seqlens=4)
    with pytest.raises(ValueError, match="k and v"):
        attn.flash_attn_with_kvcache(q, cache, cache, k=q)
    with pytest.raises(ValueError, match="rotary_cos"):
        attn.flash_attn_with_kvcache(q, cache, cache, rotary_cos=torch.ones(4, 4))
    pages = torch.randn(2, 4, 2, 8)
    with pytest.raises(ValueError, match="block_table"):
        attn.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=6, block_table=torch.tensor([[0, 7]], dtype=torch.int32))


def _paged_copy(cache, page, g):
    """A dense cache ``[B, L, H, D]`` as shuffled pages of ``page`` positions and their table."""
    b, cap = cache[0].shape[:2]
    per = cap // page
    table = torch.randperm(b * per, generator=g).view(b, per).to(torch.int32)
    pages = []
    for c in cache:
        p = torch.empty(b * per, page, *c.shape[2:], dtype=c.dtype)
        for s in range(b):
            for i in range(per):
                p[table[s, i]] = c[s, i * page:(i + 1) * page]
        pages.append(p)
    return pages, table


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("case", ["causal", "window_softcap", "bf16_pages", "noncausal_gqa"])
def test_flash_attn_with_kvcache_paged_passes_the_oracle_rule(page, case):
    """Paged caches through the paged kernel against FlashAttention's definition in float64 on each
    sequence's keys: sequences of length 0, 1 and across several pages, chunked prefill (2 new
    queries), grouped heads, windows crossing pages, soft-capping, bfloat16 pages."""
    g = torch.Generator().manual_seed(11)
    b, cap, hq, hkv, d, lq = 4, 48, 6, 2, 32, 2
    seqlens = [0, 1, 17, 46]
    opts = {"causal": dict(causal=True), "window_softcap": dict(causal=True, window=(5, -1), softcap=4.0),
            "bf16_pages": dict(causal=True), "noncausal_gqa": dict()}[case]
    dtype = torch.bfloat16 if case == "bf16_pages" else torch.float32
    dense = [torch.randn(b, cap, hkv, d, generator=g).to(dtype) for _ in range(2)]
    (k_pages, v_pages), table = _paged_copy(dense, page, g)
    q = torch.randn(b, lq, hq, d, generator=g)
    new = [torch.randn(b, lq, hkv, d, generator=g).to(dtype) for _ in range(2)]
    out, lse = attn.flash_attn_with_kvcache(
        q, k_pages, v_pages, k=new[0], v=new[1], cache_seqlens=torch.tensor(seqlens, dtype=torch.int32),
        block_table=table, causal=opts.get("causal", False), window_size=opts.get("window", (-1, -1)),
        softcap=opts.get("softcap", 0.0), return_softmax_lse=True)
    assert out.shape == (b, lq, hq, d) and lse.shape == (b, hq, lq)
    for s, n in enumerate(seqlens):
        keys = torch.cat([dense[0][s, :n], new[0][s]])[None].double()
        values = torch.cat([dense[1][s, :n], new[1][s]])[None].double()
        exact = reference(q[s:s + 1].double(), keys, values, **opts)
        naive = reference(q[s:s + 1], keys.float(), values.float(), **opts)
        for what, fast, slow, ref in (("out", out[s:s + 1], naive[0], exact[0]), ("lse", lse[s:s + 1], naive[1], exact[1])):
            err = (fast.double() - ref).abs().max().item()
            assert err <= 2 * (slow.double() - ref).abs().max().item() + 1e-6, f"{case} page {page} seq {s} {what}: {err}"


def test_flash_attn_varlen_func_with_a_block_table_equals_the_packed_keys():
    """``flash_attn_varlen_func`` with ``block_table``: packed queries against each sequence's pages
    equal the packed call on the same keys (lengths 3, 0 queries, 20)."""
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, page = 4, 2, 16, 16
    lens_q, lens_k = [3, 0, 2], [3, 5, 20]
    cap = 32
    dense = [torch.randn(3, cap, hkv, d, generator=g) for _ in range(2)]
    (k_pages, v_pages), table = _paged_copy(dense, page, g)
    q = torch.randn(sum(lens_q), hq, d, generator=g)
    cu_q = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 8, 28], dtype=torch.int32)
    packed_k = torch.cat([dense[0][s, :n] for s, n in enumerate(lens_k)])
    packed_v = torch.cat([dense[1][s, :n] for s, n in enumerate(lens_k)])
    for causal in (False, True):
        want, want_lse, _ = attn.flash_attn_varlen_func(q, packed_k, packed_v, cu_q, cu_k, 3, 20, causal=causal,
                                                       return_attn_probs=True)
        got, lse, _ = attn.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 3, 20, causal=causal,
                                                  return_attn_probs=True, block_table=table)
        assert torch.allclose(got, want, atol=1e-5) and torch.allclose(lse, want_lse, atol=1e-5)
