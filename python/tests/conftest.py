"""Shared helpers: a naive NumPy attention (the oracle in float64, the "naive32" baseline in
float32) and the team's tolerance rule, ``max|fast − ref64| ≤ k·max|naive32 − ref64| + floor``
(k = 2 for outputs, 3 for gradients)."""

import numpy as np
import pytest


def naive(q, k, v, keep=None, bias=None, causal=False, scale=None, window=None, softcap=None, align="top-left",
          key_lengths=None, dtype=np.float64):
    """Attention as the formula reads, in ``dtype``; q ``[B, Hq, Lq, D]``, k/v ``[B, Hkv, Lk, D]``.
    Fully masked rows give 0."""
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    scale = 1 / np.sqrt(d) if scale is None else scale
    s = np.einsum("bhid,bhjd->bhij", q, k) * dtype(scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, dtype=dtype)
    allowed = np.ones((b, hq, lq, lk), dtype=bool)
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    c = i + (lk - lq if align == "bottom-right" else 0)
    if causal:
        allowed &= j <= c
    if window is not None:
        left, right = window
        if left is not None:
            allowed &= j >= c - left
        if right is not None:
            allowed &= j <= c + right
    if key_lengths is not None:
        allowed &= np.arange(lk)[None, None, None, :] < np.asarray(key_lengths)[:, None, None, None]
    if keep is not None:
        allowed &= np.broadcast_to(keep, allowed.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    den = e.sum(-1, keepdims=True)
    w = np.where(den > 0, e / np.where(den > 0, den, 1), 0)
    return np.einsum("bhij,bhjd->bhid", w, v).astype(dtype)


def assert_oracle(fast, naive32, ref64, k=2.0, floor=1e-6, what="output"):
    """The team's rule: the fast result is at most ``k`` times as far from the float64 oracle as
    the naive float32 computation, plus ``floor``."""
    fast, naive32, ref64 = (np.asarray(x, dtype=np.float64) for x in (fast, naive32, ref64))
    err, base = np.abs(fast - ref64).max(), np.abs(naive32 - ref64).max()
    assert err <= k * base + floor, f"{what}: max|fast - ref64| = {err:.3e} > {k}·{base:.3e} + {floor:.0e}"


@pytest.fixture
def rng():
    return np.random.default_rng(0)
