#!/usr/bin/env python3
"""Golden fixtures for packed batches, computed by PyTorch in float64, for
`crates/attn-nn/tests/packed.rs`: the attn-nn modules' `forward_packed` against PyTorch's modules
on the padded batch with key padding.

Each case is a padded batch of sequences of different lengths (right padding), run through a
PyTorch module with key padding masks (and causal masks where the case says so), in the format of
`gen_module_fixtures.py` (its docstring describes `param.*`, `input.*`, `mask.*`, `out`, `grad_out`,
`grad.*` and the metadata), written to `crates/attn-nn/tests/fixtures/packed/<name>.safetensors`,
with two differences:
- `lengths.<input>` (I64 `[B]`): how many rows of each padded input are real; the Rust test packs
  exactly those; `lengths.out`: those of the output (its query input's);
- `grad_out` is zero beyond each sequence's length, so the gradients are those of a loss on the
  real rows only (what a packed call computes: rows beyond each length are ignored).
Padded rows are never attended as keys, so `out` at the real rows and every gradient are what the
packed call must give.

Run (from the repository root, with torch installed as for `gen_module_fixtures.py`):

    python3 scripts/gen_packed_fixtures.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gen_module_fixtures import (F64, OUT_DIR, Built, GroupedQueryAttention, Seq2Seq, causal_block, layer_config,
                                 mha_config, module_tensors, padding, randn, randomize, rope, seeded, write)

PACKED_DIR = OUT_DIR / "packed"
MAX_TOTAL_BYTES = 1_000_000


class MaskedGqa(GroupedQueryAttention):
    """`GroupedQueryAttention` of gen_module_fixtures.py (the Rust module's weight names, no sinks)
    with a key padding mask and optional causality."""

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor, causal: bool) -> torch.Tensor:
        b, length, e = x.shape
        bq, bk, bv = self.in_proj_bias.split([e, self.hkv * self.hd, self.hkv * self.hd])

        def heads(w, bias, n):
            return F.linear(x, w, bias).view(b, length, n, self.hd).transpose(1, 2)  # [B, n, L, hd]

        q, k, v = heads(self.q_proj_weight, bq, self.h), heads(self.k_proj_weight, bk, self.hkv), heads(
            self.v_proj_weight, bv, self.hkv)
        if self.rope_base is not None:
            q, k = rope(q, self.rope_base), rope(k, self.rope_base)
        keep = ~key_padding_mask.view(b, 1, 1, length)
        if causal:
            keep = keep & ~causal_block(length)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)  # [B, H, L, hd]
        return self.out_proj(o.transpose(1, 2).reshape(b, length, e))


def gqa(causal: bool, hkv: int, lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        e, h = 32, 4
        m = MaskedGqa(e, h, hkv, 10000.0)
        randomize(m, g)
        x = randn(g, len(lengths), max(lengths), e)
        kpm = padding(lengths, max(lengths))
        cfg = mha_config(e, h, num_kv_heads=hkv, causal=causal, rope=10000.0)
        return Built(m, cfg, lambda: (m(x, kpm, causal), None), {"x": x}, {"key_padding_mask": kpm},
                     {"key_padding_mask": "block"})

    return build, {"x": lengths}


def mha_cross(q_lengths: list[int], k_lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        e, h, kdim, vdim = 16, 2, 12, 8
        m = nn.MultiheadAttention(e, h, kdim=kdim, vdim=vdim, batch_first=True)
        randomize(m, g)
        b, lq, lk = len(q_lengths), max(q_lengths), max(k_lengths)
        query, key, value = randn(g, b, lq, e), randn(g, b, lk, kdim), randn(g, b, lk, vdim)
        kpm = padding(k_lengths, lk)

        def run():
            return m(query, key, value, key_padding_mask=kpm, need_weights=False)

        return Built(m, mha_config(e, h, kdim=kdim, vdim=vdim), run, {"query": query, "key": key, "value": value},
                     {"key_padding_mask": kpm}, {"key_padding_mask": "block"})

    return build, {"query": q_lengths, "key": k_lengths, "value": k_lengths}


def encoder(norm_first: bool, activation: str, causal: bool, lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        cfg = layer_config(16, 4, 32, activation=activation, norm_first=norm_first, src_is_causal=causal)
        m = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=activation, norm_first=norm_first,
                                       batch_first=True)
        randomize(m, g)
        length = max(lengths)
        src, kpm = randn(g, len(lengths), length, 16), padding(lengths, length)
        src_mask = causal_block(length) if causal else None

        def run():
            return m(src, src_mask=src_mask, src_key_padding_mask=kpm, is_causal=causal), None

        return Built(m, cfg, run, {"src": src}, {"src_key_padding_mask": kpm}, {"src_key_padding_mask": "block"})

    return build, {"src": lengths}


def decoder(tgt_lengths: list[int], mem_lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        cfg = layer_config(16, 4, 32, tgt_is_causal=True)
        m = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        randomize(m, g)
        b, lt, ls = len(tgt_lengths), max(tgt_lengths), max(mem_lengths)
        tgt, memory = randn(g, b, lt, 16), randn(g, b, ls, 16)
        masks = {"tgt_key_padding_mask": padding(tgt_lengths, lt), "memory_key_padding_mask": padding(mem_lengths, ls)}

        def run():
            return m(tgt, memory, tgt_mask=causal_block(lt), tgt_is_causal=True, **masks), None

        return Built(m, cfg, run, {"tgt": tgt, "memory": memory}, masks, dict.fromkeys(masks, "block"))

    return build, {"tgt": tgt_lengths, "memory": mem_lengths}


def transformer(src_lengths: list[int], tgt_lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        d, nhead, ff, layers = 16, 2, 32, 2
        cfg = layer_config(d, nhead, ff, num_encoder_layers=layers, num_decoder_layers=layers, tgt_is_causal=True)
        m = nn.Transformer(d, nhead, layers, layers, ff, dropout=0.0, batch_first=True)
        randomize(m, g)
        b, ls, lt = len(src_lengths), max(src_lengths), max(tgt_lengths)
        src, tgt = randn(g, b, ls, d), randn(g, b, lt, d)
        src_pad = padding(src_lengths, ls)
        masks = {"src_key_padding_mask": src_pad, "tgt_key_padding_mask": padding(tgt_lengths, lt),
                 "memory_key_padding_mask": src_pad.clone()}

        def run():
            return m(src, tgt, tgt_mask=causal_block(lt), tgt_is_causal=True, **masks), None

        return Built(m, cfg, run, {"src": src, "tgt": tgt}, masks, dict.fromkeys(masks, "block"))

    return build, {"src": src_lengths, "tgt": tgt_lengths}


def seq2seq(src_lengths: list[int], tgt_lengths: list[int]):
    def build(g: torch.Generator) -> Built:
        cfg = layer_config(16, 2, 32, num_encoder_layers=2, num_decoder_layers=2, src_vocab=11, tgt_vocab=13,
                           pad_id=0, max_len=12)
        m = Seq2Seq(cfg)
        randomize(m, g)
        b, ls, lt = len(src_lengths), max(src_lengths), max(tgt_lengths)
        src = torch.randint(1, 11, (b, ls), generator=g) * ~padding(src_lengths, ls)
        tgt = torch.randint(1, 13, (b, lt), generator=g) * ~padding(tgt_lengths, lt)
        return Built(m, cfg, lambda: (m(src, tgt), None), {"src": src, "tgt": tgt})

    return build, {"src": src_lengths, "tgt": tgt_lengths}


# Case name -> (module kind, builder and lengths per input, the output's input (its rows)).
CASES = {
    "gqa_rope_padding": ("mha", gqa(False, 2, [7, 3, 5]), "x"),
    "gqa_rope_causal_mqa": ("mha", gqa(True, 1, [4, 7, 1]), "x"),
    "mha_cross_kdim_vdim": ("mha", mha_cross([5, 2, 4], [3, 7, 6]), "query"),
    "encoder_post_relu": ("encoder_layer", encoder(False, "relu", False, [6, 2, 5]), "src"),
    "encoder_pre_gelu_causal": ("encoder_layer", encoder(True, "gelu", True, [3, 6, 4]), "src"),
    "decoder_layer": ("decoder_layer", decoder([5, 3, 4], [4, 7, 2]), "tgt"),
    "transformer": ("transformer", transformer([7, 4, 6], [3, 5, 2]), "tgt"),
    "seq2seq": ("seq2seq", seq2seq([7, 5, 3], [4, 6, 2]), "tgt"),
}


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    torch.set_default_dtype(F64)
    PACKED_DIR.mkdir(parents=True, exist_ok=True)
    for stale in PACKED_DIR.glob("*.safetensors"):
        stale.unlink()
    total = 0
    for name, (kind, (build, lengths), rows) in CASES.items():
        built = build(seeded(f"packed/{name}"))
        built.module.eval()
        real = ~padding(lengths[rows], max(lengths[rows]))  # [B, L], true at the real rows
        tensors = module_tensors(f"packed/{name}", built, rows=real)
        lengths = lengths | {"out": lengths[rows]}
        tensors |= {f"lengths.{n}": torch.tensor(v, dtype=torch.int64) for n, v in lengths.items()}
        size = write(f"packed/{name}", kind, built.config, tensors, built.polarity)
        total += size
        print(f"packed/{name:26s} {kind:16s} {size:8d} B")
    assert total <= MAX_TOTAL_BYTES, f"fixtures take {total} bytes, budget {MAX_TOTAL_BYTES}"
    print(f"{len(CASES)} fixtures, {total} bytes in {PACKED_DIR}")


if __name__ == "__main__":
    main()
