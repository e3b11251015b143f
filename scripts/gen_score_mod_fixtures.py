#!/usr/bin/env python3
"""Golden fixtures for score modifications, computed by PyTorch in float64, for
`crates/attn-kernels/tests/score_mod.rs`.

Run from the repository root (see scripts/gen_fixtures.py for the virtual environment):

    .venv/bin/python scripts/gen_score_mod_fixtures.py

Writes `crates/attn-kernels/tests/fixtures/score_mod/t5_<kind>.safetensors` for kind in
`bidirectional` (an encoder's buckets) and `causal` (a decoder's, with causal masking), holding
- `rel` (I64 [N]) and `bucket` (I64 [N]): T5's relative-position bucket of `rel = key − query`, by
  Hugging Face's `T5Attention._relative_position_bucket` restated below (32 buckets, max distance 128);
- an attention with that bias: `q` [1,H,L,D], `k`, `v` (F64), `table` [H, 32] (F64 holding values
  exact in float32, as the kernels read the table in f32), `grad_out`; `out` = softmax(q@k^T/sqrt(D) +
  table[h, bucket(j − i)] (masked causal for `causal`)) @ v, and `dq`, `dk`, `dv`, `dtable`, the
  gradients of `(out * grad_out).sum()` by autograd, all F64.
"""

import math
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent.parent / "crates" / "attn-kernels" / "tests" / "fixtures" / "score_mod"
BUCKETS, MAX_DISTANCE, H, L, D = 32, 128, 2, 150, 8


def relative_position_bucket(relative_position, bidirectional, num_buckets=BUCKETS, max_distance=MAX_DISTANCE):
    """Hugging Face's T5Attention._relative_position_bucket, as written there."""
    relative_buckets = 0
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
    return relative_buckets


def fixture(kind: str, seed: int) -> dict[str, torch.Tensor]:
    bidirectional = kind == "bidirectional"
    rel = torch.arange(-400, 401)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(H, BUCKETS, generator=g).to(torch.float64).requires_grad_(True)
    grad_out = torch.randn(1, H, L, D, generator=g, dtype=torch.float64)
    pos = torch.arange(L)
    buckets = relative_position_bucket(pos[None, :] - pos[:, None], bidirectional)  # [Lq, Lk]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D) + table[:, buckets][None]
    if not bidirectional:
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    dq, dk, dv, dtable = torch.autograd.grad((out * grad_out).sum(), (q, k, v, table))
    t = dict(rel=rel, bucket=relative_position_bucket(rel, bidirectional), q=q, k=k, v=v, table=table,
             grad_out=grad_out, out=out, dq=dq, dk=dk, dv=dv, dtable=dtable)
    return {name: x.detach().contiguous() for name, x in t.items()}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, kind in enumerate(["bidirectional", "causal"]):
        save_file(fixture(kind, seed), OUT / f"t5_{kind}.safetensors")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
