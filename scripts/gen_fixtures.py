#!/usr/bin/env python3
"""Golden attention fixtures computed by PyTorch in float64, for `crates/attn-kernels/tests/golden.rs`
(forward) and `crates/attn-kernels/tests/golden_gradients.rs` (backward).

Setup (once, from the repository root; CPU-only torch is enough):

    python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements.txt

Run (rewrites every fixture; the output is deterministic, so an unchanged grid gives identical files):

    .venv/bin/python scripts/gen_fixtures.py

Each case becomes `crates/attn-kernels/tests/fixtures/<name>.safetensors` holding
- inputs: `q` [B,Hq,Lq,Dk], `k` [B,Hkv,Lk,Dk], `v` [B,Hkv,Lk,Dv] (F64); optionally `mask` (BOOL,
  rank 1-4, broadcastable to [B,Hq,Lq,Lk], true = may attend), `bias` (F64, same broadcasting, may hold
  -inf), `key_lengths` (I64 [B]) and `sinks` (F64 [Hq], learned attention sinks as in gpt-oss, one
  head's may be -inf = no sink);
- expected results: `out` [B,Hq,Lq,Dv], `lse` [B,Hq,Lq] (natural log), `weights` [B,Hq,Lq,Lk] (F64);
- gradients (F64): a deterministic output gradient `grad_out` [B,Hq,Lq,Dv] (standard normal, drawn
  from its own generator seeded by "<name>/grad_out", so the inputs do not depend on it) and the
  gradients of `(out * grad_out).sum()`: `dq` [B,Hq,Lq,Dk], `dk` [B,Hkv,Lk,Dk], `dv` [B,Hkv,Lk,Dv]
  (for grouped-query heads summed over the query heads sharing each key/value head), when there
  is a bias, `dbias` in the bias's own (broadcast) shape, and with sinks `dsinks` [Hq]. Fully masked
  rows and masked positions get exactly zero gradient;
- metadata (all strings): `name`, `scale` ("default" = 1/sqrt(Dk), else a Python float repr),
  `causal` ("true"/"false"), `align` ("top_left"/"bottom_right"), `window_left` / `window_right`
  (keys allowed before/after the aligned diagonal, "none" = unbounded), `softcap` ("none" or a float),
  `torch_version`;
- for the `bf16_*` cases: q, k, v and grad_out rounded to bfloat16 before anything is computed, and
  PyTorch's own bf16 results beside the float64 ones (F64 holding bf16 values): `out_bf16`,
  `dq_bf16`, `dk_bf16`, `dv_bf16` (and `dbias_bf16`) from `F.scaled_dot_product_attention` with the
  math backend on bf16 tensors — the baseline error of attn's bfloat16 products
  (`crates/attn-kernels/tests/golden_bf16.rs`).

Expected values come from an explicit float64 torch implementation written as the formula reads
(scores = q@k^T * scale, softcap via tanh, + bias, masked_fill(-inf), softmax, @ v; lse via
torch.logsumexp). Sinks follow gpt-oss's reference `sdpa` (gpt_oss/torch/model.py): the head's sink
logit is concatenated to each row of scores as one more column, the softmax taken over the row, the
sink's column dropped, and the lse taken over the row with that column. Wherever PyTorch's own kernels
apply (every case without softcap), the script asserts that they agree with it (with sinks, after
rescaling their results by `exp(lse_keys - lse)`, the share of the keys, and checking
`lse = logaddexp(lse_keys, sink)`): `F.scaled_dot_product_attention` for `out` (using `is_causal`,
`enable_gqa` and `scale` natively, and an `attn_mask` for the boolean mask, the bias and the masks
SDPA lacks: bottom-right alignment, windows, key lengths), `aten._scaled_dot_product_attention_math`
for `weights` and `aten._scaled_dot_product_flash_attention_for_cpu` for `lse`.

Gradients are float64 autograd through that explicit implementation (q, k, v and the bias as
leaves; K/V heads repeated with `repeat_interleave` inside the graph, so autograd sums the groups).
A fully masked row has its scores replaced by zeros before the softmax and its weights zeroed after
it, so no NaN arises and no gradient flows from it; `masked_fill` gives masked positions exactly
zero (the script asserts those zeros: `dq` of dead rows, `dk`/`dv` of keys no query may attend,
`dbias` where masked for every query it reaches). Wherever SDPA applies (no softcap, no sinks: SDPA
has no sink), the script also asserts that autograd through
`F.scaled_dot_product_attention` with the math backend (same arguments as above, the bias reaching
it through the attention mask) gives the same `dq`, `dk`, `dv` and `dbias` to 1e-10 (relative to
1 + the gradient's magnitude); it prints the worst discrepancy seen.
No dropout: PyTorch's RNG is not ours.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save
from torch.nn.attention import SDPBackend, sdpa_kernel

OUT_DIR = Path(__file__).resolve().parent.parent / "crates" / "attn-kernels" / "tests" / "fixtures"
MAX_TOTAL_BYTES = 6_500_000
TOL = dict(rtol=1e-11, atol=1e-11)
# Autograd through SDPA (math backend) against autograd through `explicit`: max |a - b| / (1 + max |b|).
GRAD_TOL = 1e-10
# The inputs that get a gradient, in the order `dq`, `dk`, `dv`, `dbias`, `dsinks`.
GRAD_NAMES = ("q", "k", "v", "bias", "sinks")
F64 = torch.float64


@dataclass(frozen=True)
class Case:
    """One fixture: sizes, mask options and how to draw the inputs."""

    name: str
    b: int
    hq: int
    hkv: int
    lq: int
    lk: int
    dk: int
    dv: int
    scale: float | None = None
    causal: bool = False
    bottom_right: bool = False
    window: tuple[int | None, int | None] | None = None
    key_lengths: tuple[int, ...] | None = None
    # Shape of the boolean mask (rank 1-4, right-aligned to [B,Hq,Lq,Lk]); `dead_row` sets one
    # row of it entirely false.
    mask: tuple[int, ...] | None = None
    dead_row: bool = False
    bias: tuple[int, ...] | None = None
    # Fraction of bias entries set to -inf (plus one whole -inf row when > 0).
    bias_neginf: float = 0.0
    softcap: float | None = None
    # Standard deviation of q and k (larger makes the softmax peakier / exercises softcap).
    spread: float = 1.0
    # Learned attention sinks [Hq], uniform in [-1, 5) (near the rows' log-sum-exps); `sink_none`
    # makes head 0's -inf (no sink).
    sinks: bool = False
    sink_none: bool = False
    # q, k, v and grad_out rounded to bfloat16 (a bf16 model's tensors), and PyTorch's own bf16
    # results stored beside the float64 ones: the baseline error of bfloat16 products.
    bf16: bool = False


def cases() -> list[Case]:
    """The grid: shapes x mask kinds x head grouping (MHA, GQA 4/2, GQA 4/1 or 2/1)."""
    c = Case
    return [
        # Shapes, no mask.
        c("plain_mha", 2, 3, 3, 7, 9, 8, 8),
        c("plain_odd_lq_gt_lk_dk_ne_dv", 1, 1, 1, 5, 3, 5, 3),
        c("plain_l63", 1, 1, 1, 63, 63, 16, 16),
        c("plain_l64", 1, 1, 1, 64, 64, 32, 32),
        c("plain_l65_gqa_hkv1", 1, 2, 1, 65, 65, 8, 8),
        c("plain_l127_l129", 1, 1, 1, 127, 129, 8, 16),
        c("plain_l129_l127", 1, 1, 1, 129, 127, 8, 8),
        c("plain_decode_gqa", 3, 4, 2, 1, 77, 8, 8),
        c("plain_lq_gt_lk_gqa", 2, 4, 2, 33, 17, 8, 12),
        c("plain_lq_lt_lk_gqa_hkv1", 2, 4, 1, 9, 70, 16, 8),
        c("plain_dk32_dv8", 1, 2, 2, 31, 33, 32, 8),
        c("plain_peaked_scale", 1, 1, 1, 65, 65, 8, 8, scale=1.7, spread=2.0),
        c("empty_lq", 2, 2, 1, 0, 5, 8, 8),
        c("empty_lk", 2, 2, 2, 3, 0, 8, 4),
        # Causal, top-left (PyTorch is_causal) and bottom-right.
        c("causal_tl_square_gqa", 1, 4, 2, 65, 65, 8, 8, causal=True),
        c("causal_tl_lq_gt_lk", 1, 2, 2, 40, 24, 8, 8, causal=True),
        c("causal_tl_lq_lt_lk", 1, 2, 2, 24, 40, 8, 8, causal=True),
        c("causal_tl_l63_l65_gqa_hkv1", 1, 2, 1, 63, 65, 8, 8, causal=True),
        c("causal_br_square", 1, 2, 2, 64, 64, 16, 16, causal=True, bottom_right=True),
        c("causal_br_lq_lt_lk", 1, 2, 2, 24, 40, 8, 8, causal=True, bottom_right=True),
        c("causal_br_lq_gt_lk_dead_rows", 1, 2, 2, 40, 24, 8, 8, causal=True, bottom_right=True),
        c("causal_br_decode_hkv1", 2, 4, 1, 1, 65, 16, 16, causal=True, bottom_right=True),
        c("causal_br_l63_l129", 1, 1, 1, 63, 129, 8, 8, causal=True, bottom_right=True),
        # Sliding windows (left, right); None = unbounded side.
        c("window_tl_both", 1, 2, 2, 50, 50, 8, 8, window=(3, 2)),
        c("window_br_both", 1, 2, 1, 20, 45, 8, 8, window=(4, 0), bottom_right=True),
        c("window_tl_left_only", 1, 2, 2, 30, 30, 8, 8, window=(5, None)),
        c("window_br_left_only_decode", 2, 4, 2, 1, 50, 8, 8, window=(7, None), bottom_right=True),
        c("window_tl_right_only", 1, 2, 2, 17, 33, 8, 8, window=(None, 2)),
        c("window_br_right_only_dead_rows", 1, 2, 2, 30, 20, 8, 8, window=(None, 3), bottom_right=True),
        c("window_tl_zero_width", 1, 1, 1, 12, 10, 8, 8, window=(0, 0)),
        c("window_br_causal_sliding", 1, 4, 2, 16, 64, 8, 8, causal=True, window=(8, None), bottom_right=True),
        # Key lengths (one batch with length 0: every row of it is fully masked).
        c("keylen_with_zero", 3, 2, 2, 9, 17, 8, 8, key_lengths=(5, 0, 17)),
        c("keylen_causal_br", 2, 2, 1, 8, 33, 8, 8, causal=True, bottom_right=True, key_lengths=(20, 33)),
        c("keylen_decode_gqa", 4, 4, 2, 1, 40, 8, 8, key_lengths=(40, 1, 0, 23)),
        c("keylen_causal_tl_window", 2, 2, 2, 20, 20, 8, 8, causal=True, window=(6, None), key_lengths=(13, 20)),
        # Boolean masks of ranks 1-4 with broadcast dimensions.
        c("mask_rank2_dead_row", 2, 2, 2, 11, 13, 8, 8, mask=(11, 13), dead_row=True),
        c("mask_rank1_keys", 2, 2, 1, 6, 19, 8, 8, mask=(19,)),
        c("mask_rank3_heads", 2, 4, 2, 10, 15, 8, 8, mask=(4, 1, 15)),
        c("mask_rank3_rows", 2, 3, 3, 10, 15, 8, 8, mask=(1, 10, 15)),
        c("mask_rank4_full", 2, 2, 2, 9, 12, 8, 8, mask=(2, 2, 9, 12), dead_row=True),
        c("mask_rank4_padding", 3, 2, 2, 7, 21, 8, 8, mask=(3, 1, 1, 21)),
        c("mask_rank4_row_heads", 1, 4, 1, 8, 8, 8, 8, mask=(1, 4, 8, 1)),
        c("mask_causal_tl_gqa_hkv1", 1, 4, 1, 33, 33, 8, 8, causal=True, mask=(33, 33)),
        c("mask_l65_window_br", 1, 1, 1, 65, 63, 8, 8, window=(10, 10), bottom_right=True, mask=(1, 65, 63)),
        # Additive bias, broadcast, with -inf entries.
        c("bias_rank2", 2, 2, 2, 10, 14, 8, 8, bias=(10, 14)),
        c("bias_rank1", 1, 2, 1, 10, 14, 8, 8, bias=(14,)),
        c("bias_rank3_heads", 2, 4, 2, 9, 11, 8, 8, bias=(4, 1, 11)),
        c("bias_rank4_batch", 2, 2, 2, 12, 16, 8, 8, bias=(2, 1, 12, 16)),
        c("bias_neginf", 2, 2, 2, 13, 17, 8, 8, bias=(2, 2, 13, 17), bias_neginf=0.3),
        c("bias_neginf_causal_gqa", 1, 4, 2, 20, 20, 8, 8, causal=True, bias=(20, 20), bias_neginf=0.2),
        c("bias_mask_keylen", 2, 2, 1, 9, 15, 8, 8, bias=(2, 1, 9, 15), mask=(1, 9, 15), key_lengths=(15, 7)),
        # Bias broadcast along the keys: no effect on the softmax (a shift per row) but its -inf
        # entries kill whole rows, and its exact gradient (a sum of dS over a row's keys) is ~0.
        c("bias_key_broadcast_neginf", 2, 4, 2, 10, 13, 8, 8, causal=True, bias=(2, 4, 10, 1), bias_neginf=0.2),
        # Soft-capping (scores drawn wide so tanh saturates).
        c("softcap_mha", 2, 2, 2, 16, 24, 8, 8, softcap=5.0, spread=3.0),
        c("softcap_causal_br_gqa", 1, 4, 2, 24, 40, 16, 16, softcap=2.5, spread=3.0, causal=True, bottom_right=True),
        c("softcap_bias_window", 1, 2, 2, 30, 30, 8, 8, softcap=8.0, spread=3.0, bias=(30, 30), window=(5, 5)),
        # Negative and explicit scales.
        c("scale_negative", 2, 2, 2, 15, 15, 8, 8, scale=-0.3),
        c("scale_negative_causal_gqa_hkv1", 1, 4, 1, 17, 23, 16, 8, scale=-0.45, causal=True),
        # Everything at once.
        c("combined_all", 2, 4, 2, 13, 29, 8, 12, scale=-0.7, causal=True, bottom_right=True, window=(6, None),
          key_lengths=(29, 17), mask=(4, 1, 29), bias=(2, 1, 13, 29), bias_neginf=0.1, softcap=4.0, spread=2.0),
        # Attention sinks (gpt-oss): every row's softmax gets the head's sink logit in its denominator.
        c("sinks_mha", 2, 3, 3, 7, 9, 8, 8, sinks=True),
        c("sinks_l65_gqa_hkv1", 1, 2, 1, 65, 65, 8, 8, sinks=True),
        c("sinks_causal_br_dead_rows_gqa", 1, 4, 2, 40, 24, 8, 8, causal=True, bottom_right=True, sinks=True,
          sink_none=True),
        c("sinks_keylen_decode_gqa", 4, 4, 2, 1, 40, 8, 8, key_lengths=(40, 1, 0, 23), sinks=True),
        c("sinks_bias_key_broadcast", 2, 4, 2, 10, 13, 8, 8, causal=True, bias=(2, 4, 10, 1), sinks=True),
        c("sinks_combined", 2, 4, 2, 13, 29, 8, 12, scale=-0.7, window=(6, None), mask=(4, 1, 29),
          bias=(2, 1, 13, 29), bias_neginf=0.1, softcap=4.0, spread=2.0, sinks=True, sink_none=True),
        # bfloat16 inputs with PyTorch's bf16 math path beside the float64 results.
        c("bf16_plain_gqa", 1, 4, 2, 40, 50, 32, 32, bf16=True),
        c("bf16_causal_tl", 1, 2, 2, 48, 48, 64, 64, causal=True, bf16=True),
        c("bf16_bias_rank2", 1, 2, 1, 33, 40, 16, 24, bias=(33, 40), bf16=True),
        c("bf16_keylen_window_br", 2, 2, 1, 30, 40, 32, 32, window=(9, 3), bottom_right=True, key_lengths=(40, 23),
          bf16=True),
    ]


def draw_inputs(case: Case) -> dict[str, torch.Tensor]:
    """q, k, v and the optional mask, bias and key lengths, from a generator seeded by the case name."""
    g = torch.Generator().manual_seed(zlib.crc32(case.name.encode()))
    t = {
        "q": torch.randn(case.b, case.hq, case.lq, case.dk, generator=g, dtype=F64) * case.spread,
        "k": torch.randn(case.b, case.hkv, case.lk, case.dk, generator=g, dtype=F64) * case.spread,
        "v": torch.randn(case.b, case.hkv, case.lk, case.dv, generator=g, dtype=F64),
    }
    if case.mask is not None:
        mask = torch.rand(case.mask, generator=g, dtype=F64) < 0.7
        if case.dead_row:
            mask.view(-1, *case.mask[-2:])[0, min(2, case.mask[-2] - 1)] = False
        t["mask"] = mask
    if case.bias is not None:
        bias = torch.randn(case.bias, generator=g, dtype=F64) * 2.0
        if case.bias_neginf > 0:
            bias[torch.rand(case.bias, generator=g, dtype=F64) < case.bias_neginf] = -math.inf
            bias.view(-1, *case.bias[-2:])[0, min(1, case.bias[-2] - 1)] = -math.inf
        t["bias"] = bias
    if case.key_lengths is not None:
        t["key_lengths"] = torch.tensor(case.key_lengths, dtype=torch.int64)
    if case.sinks:
        sinks = torch.rand(case.hq, generator=g, dtype=F64) * 6.0 - 1.0
        if case.sink_none:
            sinks[0] = -math.inf
        t["sinks"] = sinks
    if case.bf16:
        t.update({n: to_bf16(t[n]) for n in ("q", "k", "v")})
    return t


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded to bfloat16 (to nearest, ties to even), back in float64."""
    return x.to(torch.bfloat16).to(F64)


def allowed_mask(case: Case, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B,Hq,Lq,Lk] bool: true where the key may be attended (band, key lengths, mask, bias != -inf)."""
    i = torch.arange(case.lq).view(-1, 1)
    j = torch.arange(case.lk).view(1, -1)
    # Bottom-right aligns the last query with key Lk - 1, whatever the batch's key length.
    diag = i + (case.lk - case.lq if case.bottom_right else 0)
    allowed = torch.ones(case.b, case.hq, case.lq, case.lk, dtype=torch.bool)
    if case.causal:
        allowed &= j <= diag
    if case.window is not None:
        left, right = case.window
        if left is not None:
            allowed &= j >= diag - left
        if right is not None:
            allowed &= j <= diag + right
    if "key_lengths" in t:
        allowed &= j.view(1, 1, 1, -1) < t["key_lengths"].view(-1, 1, 1, 1)
    if "mask" in t:
        allowed &= t["mask"]
    if "bias" in t:
        allowed &= t["bias"] != -math.inf
    return allowed


def scale_of(case: Case) -> float:
    return case.scale if case.scale is not None else 1.0 / math.sqrt(case.dk)


def explicit(case: Case, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The straightforward float64 attention: returns (out, lse, weights, allowed). Differentiable
    in q, k, v and the bias when they require grad."""
    group = case.hq // case.hkv
    k = t["k"].repeat_interleave(group, dim=1)
    v = t["v"].repeat_interleave(group, dim=1)
    scores = t["q"] @ k.transpose(-1, -2) * scale_of(case)
    if case.softcap is not None:
        scores = case.softcap * torch.tanh(scores / case.softcap)
    if "bias" in t:
        scores = scores + t["bias"]
    allowed = allowed_mask(case, t)
    scores = scores.masked_fill(~allowed, -math.inf)
    dead = ~allowed.any(dim=-1, keepdim=True)
    if "sinks" in t:
        # gpt-oss: the sink logit as one more column of every row, dropped after the softmax.
        sink = t["sinks"].view(1, -1, 1, 1)
        scores = torch.cat([scores, sink.expand(case.b, case.hq, case.lq, 1)], dim=-1)
        dead = dead & (sink == -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf on a fully masked row (without a sink)
    # A fully masked row: softmax over all -inf gives NaN in PyTorch (and SDPA's math path gives 0
    # weights). Our semantics are output 0, lse -inf, weights 0 - so such a row's scores are
    # replaced by zeros (finite softmax, no NaN in the forward or the backward) and its weights
    # by zeros after the softmax (nothing flows back from it, and its output is 0). With a sink the
    # row is a softmax over the sink alone: weights 0, output 0, lse = the sink.
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    weights = weights[..., :case.lk]
    out = weights @ v
    return out, lse, weights, allowed


def draw_grad_out(case: Case) -> torch.Tensor:
    """The output gradient [B,Hq,Lq,Dv], from its own generator (the inputs do not depend on it)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/grad_out".encode()))
    grad_out = torch.randn(case.b, case.hq, case.lq, case.dv, generator=g, dtype=F64)
    return to_bf16(grad_out) if case.bf16 else grad_out


def torch_bf16(case: Case, t: dict[str, torch.Tensor], grad_out: torch.Tensor, allowed) -> dict[str, torch.Tensor]:
    """PyTorch's own bf16 results (`<name>_bf16`, stored as float64): `F.scaled_dot_product_attention`
    with the math backend on bf16 q, k, v (and bias), its `out` and the gradients of
    `(out * grad_out).sum()` with a bf16 `grad_out`."""
    bf = torch.bfloat16
    mask, is_causal = sdpa_mask(case, t, allowed)
    leaf = {n: t[n].to(bf).requires_grad_() for n in ("q", "k", "v")}
    if mask is not None and mask.is_floating_point():
        mask = mask.to(bf).requires_grad_("bias" in t and mask.shape == t["bias"].shape)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(leaf["q"], leaf["k"], leaf["v"], attn_mask=mask, is_causal=is_causal,
                                             scale=case.scale, enable_gqa=case.hq != case.hkv)
    out.backward(grad_out.to(bf))
    res = {"out": out, **{f"d{n}": x.grad for n, x in leaf.items()}}
    if "bias" in t:
        assert mask is not None and mask.requires_grad, f"{case.name}: the bias must reach SDPA as given"
        res["dbias"] = mask.grad.reshape(t["bias"].shape)
    return {f"{n}_bf16": x.detach().to(F64).contiguous() for n, x in res.items()}


def leaves(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of the inputs with q, k, v and the bias as autograd leaves."""
    return {n: x.clone().requires_grad_(n in GRAD_NAMES) for n, x in t.items()}


def gradients(t: dict[str, torch.Tensor], out: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """`dq`, `dk`, `dv` (and `dbias`) of `(out * grad_out).sum()` with respect to the leaves of `t`."""
    names = [n for n in GRAD_NAMES if n in t]
    grads = torch.autograd.grad((out * grad_out).sum(), [t[n] for n in names], allow_unused=True)
    return {f"d{n}": (torch.zeros_like(t[n]) if g is None else g).detach() for n, g in zip(names, grads)}


def sdpa_mask(case: Case, t: dict[str, torch.Tensor], allowed: torch.Tensor):
    """(attn_mask, is_causal) expressing the case through SDPA's own arguments: `is_causal` for a lone
    top-left causal mask, the broadcast `mask` or `bias` as given when it is the only one, otherwise
    everything folded into one full-size mask (float when there is a bias, else bool)."""
    # PyTorch 2.15's CPU flash kernel returns NaN for `is_causal` with a negative scale, so that
    # combination goes through an explicit mask as well.
    negative = case.scale is not None and case.scale < 0
    native_causal = case.causal and not case.bottom_right and not negative
    folded = case.window is not None or "key_lengths" in t or (case.causal and not native_causal)
    user = [name for name in ("mask", "bias") if name in t]
    if not folded and not user:
        return None, native_causal
    if not folded and not native_causal and len(user) == 1:
        given = t[user[0]]
        return (given.unsqueeze(0) if given.dim() == 1 else given), False  # SDPA wants rank >= 2
    return full_float_mask(t, allowed) if "bias" in t else allowed, False


def full_float_mask(t: dict[str, torch.Tensor], allowed: torch.Tensor) -> torch.Tensor:
    """[B,Hq,Lq,Lk] additive mask: the bias (or 0) where allowed, -inf elsewhere."""
    base = t["bias"].expand(allowed.shape) if "bias" in t else torch.zeros(allowed.shape, dtype=F64)
    return base.masked_fill(~allowed, -math.inf)


def cross_check(case: Case, t: dict[str, torch.Tensor], out, lse, weights, allowed) -> None:
    """Asserts that PyTorch's kernels reproduce the explicit results on every row with a live key
    (fully masked rows hold our convention, set explicitly in `explicit`, so they are left out).
    PyTorch has no sinks: with them its results over the keys are rescaled by the keys' share of
    the row, `exp(lse_keys - lse)`, and its lse joined to the sink, before the comparison."""
    if case.softcap is not None or 0 in (case.b, case.lq, case.lk):
        return
    attn_mask, is_causal = sdpa_mask(case, t, allowed)
    live = allowed.any(dim=-1)
    q, k, v, scale = t["q"], t["k"], t["v"], case.scale
    group = case.hq // case.hkv
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    # The CPU flash op wants one head size: zero columns change neither the scores nor the lse.
    d = max(case.dk, case.dv)
    qp, kp, vp = (F.pad(x, (0, d - x.shape[-1])) for x in (q, kr, vr))
    float_mask = None if attn_mask is None else full_float_mask(t, allowed)
    _, lse_keys = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qp, kp, vp, 0.0, is_causal, attn_mask=float_mask, scale=scale_of(case))
    lse_flash, share = lse_keys, torch.ones_like(lse)
    if "sinks" in t:
        lse_flash = torch.logaddexp(lse_keys, t["sinks"].view(1, -1, 1).expand_as(lse_keys))
        share = torch.exp(lse_keys - lse)
    assert torch.allclose(lse_flash[live], lse[live], **TOL), f"{case.name}: SDPA flash lse differs"

    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=case.hq != case.hkv)
    sdpa = sdpa * share.unsqueeze(-1)
    assert torch.allclose(sdpa[live], out[live], **TOL), f"{case.name}: SDPA out differs"

    # The aten op below adds its mask: a boolean one goes in as 0 / -inf.
    additive = attn_mask
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        additive = torch.zeros(attn_mask.shape, dtype=F64).masked_fill(~attn_mask, -math.inf)
    _, w_math = torch.ops.aten._scaled_dot_product_attention_math(q, kr, vr, additive, 0.0, is_causal,
                                                                   scale=scale)
    w_math = w_math * share.unsqueeze(-1)
    assert torch.allclose(w_math[live], weights[live], **TOL), f"{case.name}: SDPA math weights differ"


def cross_check_grads(case: Case, t: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], grad_out, allowed) -> float:
    """Asserts that autograd through SDPA (math backend) reproduces the explicit gradients; returns
    the worst relative discrepancy (0 where SDPA does not apply: softcap, sinks, empty sizes)."""
    if case.softcap is not None or case.sinks or 0 in (case.b, case.lq, case.lk):
        return 0.0
    t = leaves(t)
    attn_mask, is_causal = sdpa_mask(case, t, allowed)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=attn_mask, is_causal=is_causal,
                                             scale=case.scale, enable_gqa=case.hq != case.hkv)
    sdpa = gradients(t, out, grad_out)
    worst = 0.0
    for name, want in grads.items():
        got = sdpa[name]
        assert got.shape == want.shape, f"{case.name}: SDPA {name} shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        assert not got.isnan().any(), f"{case.name}: SDPA {name} holds NaN"
        err = float((got - want).abs().max()) / (1.0 + float(want.abs().max())) if want.numel() else 0.0
        assert err <= GRAD_TOL, f"{case.name}: SDPA {name} differs by {err:e} (relative)"
        worst = max(worst, err)
    return worst


def check_zero_grads(case: Case, grads: dict[str, torch.Tensor], allowed: torch.Tensor) -> None:
    """Asserts exact zeros where nothing flows: `dq` of fully masked rows, `dk`/`dv` of keys no
    query row may attend, and `dbias` at positions masked for every query it broadcasts to."""
    dead = ~allowed.any(dim=-1)
    assert (grads["dq"][dead] == 0).all(), f"{case.name}: dq of a fully masked row is not 0"
    group = case.hq // case.hkv
    # [B,Hkv,Lk]: some query of the group may attend the key.
    used = allowed.reshape(case.b, case.hkv, group, case.lq, case.lk).any(dim=2).any(dim=2)
    for name in ("dk", "dv"):
        assert (grads[name][~used] == 0).all(), f"{case.name}: {name} of a key masked everywhere is not 0"
    if "dbias" in grads:
        bshape = grads["dbias"].shape
        # A bias element is live when some position it broadcasts to is allowed.
        live = allowed
        for axis in range(4):
            if axis < 4 - len(bshape) or bshape[axis - 4 + len(bshape)] == 1:
                live = live.any(dim=axis, keepdim=True)
        live = live.reshape(bshape)
        assert (grads["dbias"][~live] == 0).all(), f"{case.name}: dbias at a masked position is not 0"


def metadata(case: Case) -> dict[str, str]:
    def opt(x) -> str:
        return "none" if x is None else repr(x)

    left, right = case.window if case.window is not None else (None, None)
    return {
        "name": case.name,
        "scale": "default" if case.scale is None else repr(float(case.scale)),
        "causal": "true" if case.causal else "false",
        "align": "bottom_right" if case.bottom_right else "top_left",
        "window_left": opt(left),
        "window_right": opt(right),
        "softcap": opt(None if case.softcap is None else float(case.softcap)),
        "torch_version": torch.__version__.split("+")[0],
    }


def save_sorted(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    """Writes a safetensors file whose metadata keys are sorted: safetensors keeps them in a hash
    map, so their order (and the file's bytes) would otherwise change from run to run."""
    data = save(tensors, metadata=meta)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n, f"{path.name}: header length changed"
    path.write_bytes(data[:8] + text + data[8 + n:])


def main() -> None:
    torch.use_deterministic_algorithms(True)
    grid = cases()
    names = [c.name for c in grid]
    assert len(set(names)) == len(names), "case names must be unique"
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in OUT_DIR.glob("*.safetensors"):
        stale.unlink()
    total = 0
    worst = 0.0
    for case in grid:
        t = draw_inputs(case)
        leaf = leaves(t)
        out, lse, weights, allowed = explicit(case, leaf)
        grad_out = draw_grad_out(case)
        grads = gradients(leaf, out, grad_out)
        out, lse, weights = out.detach(), lse.detach(), weights.detach()
        expected = dict(out=out, lse=lse, weights=weights, **grads)
        assert not any(x.isnan().any() for x in expected.values()), f"{case.name}: NaN in expected values"
        check_zero_grads(case, grads, allowed)
        cross_check(case, t, out, lse, weights, allowed)
        worst = max(worst, cross_check_grads(case, t, grads, grad_out, allowed))
        tensors = {name: x.contiguous() for name, x in t.items()}
        tensors.update({name: x.contiguous() for name, x in expected.items()}, grad_out=grad_out)
        if case.bf16:
            tensors.update(torch_bf16(case, t, grad_out, allowed))
        path = OUT_DIR / f"{case.name}.safetensors"
        save_sorted(tensors, path, metadata(case))
        size = path.stat().st_size
        total += size
        dead = int((~allowed.any(dim=-1)).sum())
        print(f"{case.name:40s} {size:8d} B  dead rows {dead}")
    print(f"gradients: autograd through SDPA (math) agrees with the explicit ones to {worst:.2e} (relative)")
    print(f"{len(grid)} fixtures, {total} bytes in {OUT_DIR}")
    assert total <= MAX_TOTAL_BYTES, f"fixtures take {total} bytes, budget {MAX_TOTAL_BYTES}"


if __name__ == "__main__":
    main()
