#!/usr/bin/env python3
"""Golden module fixtures computed by PyTorch in float64, for `crates/attn-nn/tests/pytorch_parity.rs`:
each of the attn-nn modules against its PyTorch counterpart (`nn.MultiheadAttention`,
`nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer`, `nn.Transformer`) or, where PyTorch has
none, a short PyTorch module written here with the Rust module's weight names (grouped-query and
rotary attention, gpt-oss's learned attention sinks, a token-level Seq2Seq, single-head
self-attention, additive attention); plus the position helpers (ALiBi, sinusoidal table).

Setup (once, from the repository root; CPU-only torch is enough):

    python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements.txt

Run (rewrites every fixture; the output is deterministic, so unchanged cases give identical files):

    .venv/bin/python scripts/gen_module_fixtures.py

Each module case becomes `crates/attn-nn/tests/fixtures/<name>.safetensors` holding
- `param.<name>` (F64): every entry of the module's state dict under its PyTorch name. Weights are
  drawn from a generator seeded by the case name (biases and LayerNorm affines included, so none is
  a trivial 0 or 1);
- `input.<name>`: the inputs, F64 (`x`, or `query`/`key`/`value`, `src`/`tgt`/`memory`) or I64
  token ids (`src`, `tgt` of the Seq2Seq case, padding id 0);
- `mask.<name>`: masks as PyTorch took them, BOOL with the polarity given in the metadata (`block`:
  true = may NOT attend, PyTorch's module convention; `keep`: true = may attend, SDPA's) or F64
  additive (`0` / finite bias / `-inf`; key padding masks too). Names are PyTorch's arguments: `key_padding_mask`,
  `attn_mask`, `src_key_padding_mask`, `tgt_mask`, `tgt_key_padding_mask`,
  `memory_key_padding_mask`. No query row is fully masked (PyTorch gives NaN there);
- `out` (F64): the module's output; `weights` (F64) when the case asks for attention weights;
- `grad_out` (F64, shape of `out`): standard normal from its own generator (seeded by
  "<name>/grad_out"), and the float64 autograd gradients of `(out * grad_out).sum()` with respect to
  every float input (`grad.input.<name>`) and every parameter (`grad.param.<name>`);
- metadata (strings): `name`, `module` (which Rust module: `mha`, `encoder_layer`,
  `decoder_layer`, `transformer`, `seq2seq`, `self_attention`, `additive`, `layer_norm`), `config` (JSON: the
  module's configuration under the Rust config's field names, plus the call's flags:
  `need_weights` "averaged" / "per_head" / null (a boolean for single-head self-attention),
  `causal` / `src_is_causal` / `tgt_is_causal`),
  `masks` (JSON: polarity per boolean mask), `torch_version`.

Position helper cases (`module` = `alibi` or `sinusoidal`) hold only `out` (and `slopes` for
ALiBi) and their `config`; they have no parameters, inputs or gradients.

`state_dicts/<name>.safetensors` are whole float32 state dicts as a PyTorch user saves them
(`safetensors.torch.save_file(module.state_dict(), path)`), for `crates/attn-nn/tests/loading.rs`.

Every module runs in eval mode with dropout 0, `batch_first=True` unless its config says
`batch_first: false` (inputs `[L, B, E]`; inputs of rank 2 are unbatched); inputs require grad and
grad is enabled, so PyTorch's fused fast paths (which skip the masks' NaN handling and nested
tensors) are never taken. Config fields added after the first fixtures (`add_bias_kv`,
`add_zero_attn`, `batch_first`, a layer's `bias`, `sinks`) appear only in the cases that set them;
the Rust harness reads an absent one as PyTorch's value in those first fixtures (false, false,
true, true; no sinks). Where a PyTorch module gets a causal flag (`is_causal`, `tgt_is_causal`: only a
hint there) it also gets the matching boolean mask; the fixture then stores the flag, not the mask.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from gen_fixtures import save_sorted

OUT_DIR = Path(__file__).resolve().parent.parent / "crates" / "attn-nn" / "tests" / "fixtures"
MAX_TOTAL_BYTES = 3_000_000
F64 = torch.float64
BATCH = 2


@dataclass
class Built:
    """One module case, ready to run: `run()` returns `(out, weights or None)` from the inputs."""

    module: nn.Module
    config: dict
    run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    # Polarity of each boolean mask: "block" (true = masked) or "keep" (true = may attend).
    polarity: dict[str, str] = field(default_factory=dict)


def randomize(module: nn.Module, g: torch.Generator) -> None:
    """Overwrites every parameter: matrices ~ N(0, 1/fan_in), LayerNorm weights ~ 1 + N(0, 0.2²),
    other vectors ~ N(0, 0.2²), embedding tables ~ N(0, 1)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=F64)
            if "embed" in name:
                p.copy_(noise)
            elif p.dim() == 2:
                p.copy_(noise / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=F64).requires_grad_(True)


def padding(lens: list[int], length: int, left: list[int] | None = None) -> torch.Tensor:
    """[B, L] bool, true = padding: row b keeps positions `left[b] .. left[b] + lens[b]`."""
    left = left or [0] * len(lens)
    j = torch.arange(length)
    return torch.stack([(j < s) | (j >= s + n) for s, n in zip(left, lens)])


def causal_block(length: int) -> torch.Tensor:
    """[L, L] bool, true above the diagonal (key j > query i may not be attended)."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def mha_config(embed_dim: int, num_heads: int, **extra) -> dict:
    base = dict(embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=None, kdim=None, vdim=None, bias=True,
                rope=None, causal=False, need_weights=None)
    return base | extra


def layer_config(d_model: int, nhead: int, dim_feedforward: int, **extra) -> dict:
    base = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, activation="relu",
                layer_norm_eps=1e-5, norm_first=False)
    return base | extra


# --- nn.MultiheadAttention -------------------------------------------------------------------------------

def mha_self_padding(g: torch.Generator) -> Built:
    """Self-attention (q = k = v = x) with a key padding mask; head-averaged weights."""
    e, h, length = 16, 4, 6
    m = nn.MultiheadAttention(e, h, batch_first=True)
    randomize(m, g)
    x = randn(g, BATCH, length, e)
    kpm = padding([6, 3], length, left=[0, 2])

    def run():
        return m(x, x, x, key_padding_mask=kpm, need_weights=True, average_attn_weights=True)

    return Built(m, mha_config(e, h, need_weights="averaged"), run, {"x": x}, {"key_padding_mask": kpm},
                 {"key_padding_mask": "block"})


def mha_cross_kdim_vdim(g: torch.Generator) -> Built:
    """Cross-attention from keys of width 12 and values of width 8 (separate q/k/v projection
    weights) with a boolean [Lq, Lk] attention mask; per-head weights."""
    e, h, kdim, vdim, lq, lk = 16, 2, 12, 8, 5, 7
    m = nn.MultiheadAttention(e, h, kdim=kdim, vdim=vdim, batch_first=True)
    randomize(m, g)
    query, key, value = randn(g, BATCH, lq, e), randn(g, BATCH, lk, kdim), randn(g, BATCH, lk, vdim)
    attn_mask = torch.rand(lq, lk, generator=g, dtype=F64) < 0.4
    attn_mask[:, 1] = False  # every query keeps key 1

    def run():
        return m(query, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)

    cfg = mha_config(e, h, kdim=kdim, vdim=vdim, need_weights="per_head")
    return Built(m, cfg, run, {"query": query, "key": key, "value": value}, {"attn_mask": attn_mask},
                 {"attn_mask": "block"})


def mha_float_mask_nobias(g: torch.Generator) -> Built:
    """Attention without biases under an additive float mask [B·H, Lq, Lk] (random bias with -inf
    entries); no weights asked."""
    e, h, lq, lk = 24, 3, 4, 6
    m = nn.MultiheadAttention(e, h, bias=False, batch_first=True)
    randomize(m, g)
    query, key, value = randn(g, BATCH, lq, e), randn(g, BATCH, lk, e), randn(g, BATCH, lk, e)
    attn_mask = torch.randn(BATCH * h, lq, lk, generator=g, dtype=F64)
    attn_mask[torch.rand(attn_mask.shape, generator=g, dtype=F64) < 0.25] = -math.inf
    attn_mask[:, :, 0] = 0.5  # every row keeps key 0

    def run():
        return m(query, key, value, attn_mask=attn_mask, need_weights=False)

    return Built(m, mha_config(e, h, bias=False), run, {"query": query, "key": key, "value": value},
                 {"attn_mask": attn_mask})


def mha_bias_kv_causal(g: torch.Generator) -> Built:
    """`add_bias_kv`: learned rows `bias_k`/`bias_v` appended after the projected keys and values,
    which every query may attend (PyTorch pads the masks with a zero column); causal self-attention
    (given to PyTorch as its boolean mask) with key padding; per-head weights over Lk + 1 keys."""
    e, h, length = 16, 4, 5
    m = nn.MultiheadAttention(e, h, add_bias_kv=True, batch_first=True)
    randomize(m, g)
    x = randn(g, BATCH, length, e)
    kpm = padding([5, 3], length)

    def run():
        return m(x, x, x, key_padding_mask=kpm, attn_mask=causal_block(length), need_weights=True,
                 average_attn_weights=False)

    cfg = mha_config(e, h, add_bias_kv=True, causal=True, need_weights="per_head")
    return Built(m, cfg, run, {"x": x}, {"key_padding_mask": kpm}, {"key_padding_mask": "block"})


def mha_zero_attn_seq_first(g: torch.Generator) -> Built:
    """`add_zero_attn` (a zero key and value appended per head), `batch_first=False` ([L, B, E]
    inputs), cross-attention under an additive float key padding mask [B, Lk] with -inf entries;
    head-averaged weights over Lk + 1 keys."""
    e, h, lq, lk = 12, 3, 4, 6
    m = nn.MultiheadAttention(e, h, add_zero_attn=True)
    randomize(m, g)
    query, key, value = randn(g, lq, BATCH, e), randn(g, lk, BATCH, e), randn(g, lk, BATCH, e)
    kpm = torch.randn(BATCH, lk, generator=g, dtype=F64)
    kpm[1, 4:] = -math.inf

    def run():
        return m(query, key, value, key_padding_mask=kpm, need_weights=True, average_attn_weights=True)

    cfg = mha_config(e, h, add_zero_attn=True, batch_first=False, need_weights="averaged")
    return Built(m, cfg, run, {"query": query, "key": key, "value": value}, {"key_padding_mask": kpm})


def mha_unbatched_bias_kv_zero_attn(g: torch.Generator) -> Built:
    """Unbatched inputs (query [Lq, E], key [Lk, kdim], value [Lk, vdim]) with `add_bias_kv` and
    `add_zero_attn`, a boolean key padding mask [Lk] and an additive per-head attention mask
    [H, Lq, Lk]; per-head weights [H, Lq, Lk + 2]."""
    e, h, kdim, vdim, lq, lk = 16, 2, 10, 6, 3, 5
    m = nn.MultiheadAttention(e, h, add_bias_kv=True, add_zero_attn=True, kdim=kdim, vdim=vdim)
    randomize(m, g)
    query, key, value = randn(g, lq, e), randn(g, lk, kdim), randn(g, lk, vdim)
    kpm = torch.tensor([False, False, True, False, True])
    attn_mask = torch.randn(h, lq, lk, generator=g, dtype=F64)

    def run():
        return m(query, key, value, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=True,
                 average_attn_weights=False)

    cfg = mha_config(e, h, kdim=kdim, vdim=vdim, add_bias_kv=True, add_zero_attn=True, need_weights="per_head")
    return Built(m, cfg, run, {"query": query, "key": key, "value": value},
                 {"key_padding_mask": kpm, "attn_mask": attn_mask}, {"key_padding_mask": "block"})


# --- Grouped-query attention (no PyTorch module: written with the Rust module's names) ---------------------

def rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Hugging Face Llama's rotary embedding (rotate_half) of x: [B, n, L, d] at positions 0..L-1."""
    d, length = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=F64) / d))
    freqs = torch.outer(torch.arange(length, dtype=F64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [L, d]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


class GroupedQueryAttention(nn.Module):
    """Causal self-attention with `num_kv_heads` key/value heads shared by groups of query heads;
    with `sinks`, gpt-oss's learned attention sinks (a parameter `sinks` [H], applied as
    gpt_oss/torch/model.py's `sdpa` does: the head's sink logit concatenated to every row of
    scores, the softmax taken, the sink's column dropped)."""

    def __init__(self, e: int, h: int, hkv: int, rope_base: float | None, sinks: bool = False):
        super().__init__()
        self.h, self.hkv, self.hd, self.rope_base = h, hkv, e // h, rope_base
        kv = hkv * self.hd
        self.q_proj_weight = nn.Parameter(torch.empty(e, e, dtype=F64))
        self.k_proj_weight = nn.Parameter(torch.empty(kv, e, dtype=F64))
        self.v_proj_weight = nn.Parameter(torch.empty(kv, e, dtype=F64))
        self.in_proj_bias = nn.Parameter(torch.empty(e + 2 * kv, dtype=F64))
        self.out_proj = nn.Linear(e, e, dtype=F64)
        self.sinks = nn.Parameter(torch.empty(h, dtype=F64)) if sinks else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, e = x.shape
        bq, bk, bv = self.in_proj_bias.split([e, self.hkv * self.hd, self.hkv * self.hd])

        def heads(w, bias, n):
            return F.linear(x, w, bias).view(b, length, n, self.hd).transpose(1, 2)  # [B, n, L, hd]

        q = heads(self.q_proj_weight, bq, self.h)
        k = heads(self.k_proj_weight, bk, self.hkv)
        v = heads(self.v_proj_weight, bv, self.hkv)
        if self.rope_base is not None:
            q, k = rope(q, self.rope_base), rope(k, self.rope_base)
        if self.sinks is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, L, hd]
        else:
            group = self.h // self.hkv
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2) / math.sqrt(self.hd)).masked_fill(causal_block(length), -math.inf)
            sink = self.sinks.view(1, -1, 1, 1).expand(b, self.h, length, 1)
            o = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ v
        return self.out_proj(o.transpose(1, 2).reshape(b, length, e))


def gqa_case(e: int, h: int, hkv: int, rope_base: float | None, sinks: bool = False) -> Callable[[torch.Generator], Built]:
    def build(g: torch.Generator) -> Built:
        m = GroupedQueryAttention(e, h, hkv, rope_base, sinks)
        randomize(m, g)
        x = randn(g, BATCH, 7, e)
        cfg = mha_config(e, h, num_kv_heads=hkv, causal=True, rope=rope_base) | ({"sinks": True} if sinks else {})
        return Built(m, cfg, lambda: (m(x), None), {"x": x})

    return build


# --- Transformer layers and stacks --------------------------------------------------------------------------

def encoder_post_relu_padding(g: torch.Generator) -> Built:
    """Post-norm ReLU encoder layer with a source key padding mask (left and right padding)."""
    cfg = layer_config(16, 2, 32)
    m = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    randomize(m, g)
    src = randn(g, BATCH, 6, 16)
    kpm = padding([5, 4], 6, left=[1, 0])
    return Built(m, cfg, lambda: (m(src, src_key_padding_mask=kpm), None), {"src": src},
                 {"src_key_padding_mask": kpm}, {"src_key_padding_mask": "block"})


def encoder_pre_gelu_causal(g: torch.Generator) -> Built:
    """Pre-norm GELU encoder layer, causal (`is_causal` with its mask) and right padding."""
    cfg = layer_config(16, 4, 32, activation="gelu", norm_first=True, src_is_causal=True)
    m = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", norm_first=True, batch_first=True)
    randomize(m, g)
    src = randn(g, BATCH, 6, 16)
    kpm = padding([6, 4], 6)

    def run():
        return m(src, src_mask=causal_block(6), src_key_padding_mask=kpm, is_causal=True), None

    return Built(m, cfg, run, {"src": src}, {"src_key_padding_mask": kpm}, {"src_key_padding_mask": "block"})


def decoder_causal_padding(g: torch.Generator) -> Built:
    """Post-norm decoder layer: boolean causal target mask, target and memory key padding."""
    cfg = layer_config(16, 4, 32)
    m = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    randomize(m, g)
    tgt, memory = randn(g, BATCH, 5, 16), randn(g, BATCH, 7, 16)
    masks = {
        "tgt_mask": causal_block(5),
        "tgt_key_padding_mask": padding([5, 3], 5),
        "memory_key_padding_mask": padding([4, 7], 7),
    }
    return Built(m, cfg, lambda: (m(tgt, memory, **masks), None), {"tgt": tgt, "memory": memory}, masks,
                 dict.fromkeys(masks, "block"))


def encoder_no_bias_seq_first(g: torch.Generator) -> Built:
    """`bias=False` (no Linear, attention or LayerNorm biases), `batch_first=False` ([L, B, E]),
    pre-norm, source key padding."""
    cfg = layer_config(16, 4, 32, bias=False, batch_first=False, norm_first=True)
    m = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, bias=False, norm_first=True)
    randomize(m, g)
    src = randn(g, 6, BATCH, 16)
    kpm = padding([6, 4], 6, left=[0, 1])
    return Built(m, cfg, lambda: (m(src, src_key_padding_mask=kpm), None), {"src": src},
                 {"src_key_padding_mask": kpm}, {"src_key_padding_mask": "block"})


def decoder_no_bias_unbatched(g: torch.Generator) -> Built:
    """`bias=False` decoder layer on unbatched inputs (tgt [Lt, E], memory [Ls, E]): causal
    target, memory key padding [Ls]."""
    cfg = layer_config(16, 2, 24, bias=False, tgt_is_causal=True)
    m = nn.TransformerDecoderLayer(16, 2, 24, dropout=0.0, bias=False, batch_first=True)
    randomize(m, g)
    tgt, memory = randn(g, 4, 16), randn(g, 6, 16)
    mkpm = padding([4], 6)[0]

    def run():
        return m(tgt, memory, tgt_mask=causal_block(4), tgt_is_causal=True, memory_key_padding_mask=mkpm), None

    return Built(m, cfg, run, {"tgt": tgt, "memory": memory}, {"memory_key_padding_mask": mkpm},
                 {"memory_key_padding_mask": "block"})


def transformer_masks(src_len: list[int], ls: int, tgt_len: list[int], lt: int) -> dict[str, torch.Tensor]:
    """nn.Transformer's key padding masks for right-padded source and target rows."""
    src_pad = padding(src_len, ls)
    return {"src_key_padding_mask": src_pad, "tgt_key_padding_mask": padding(tgt_len, lt),
            "memory_key_padding_mask": src_pad.clone()}


def transformer_case(d: int, nhead: int, ff: int, layers: int, src_len: list[int], tgt_len: list[int],
                     **options) -> Callable[[torch.Generator], Built]:
    """nn.Transformer with `layers` + `layers` layers and `options` (`bias`, `batch_first`, both in
    the config only when given): source/target/memory padding of rows `src_len`/`tgt_len`, causal
    target."""
    def build(g: torch.Generator) -> Built:
        ls, lt = max(src_len), max(tgt_len)
        cfg = layer_config(d, nhead, ff, num_encoder_layers=layers, num_decoder_layers=layers, tgt_is_causal=True,
                           **options)
        batch_first = options.get("batch_first", True)
        m = nn.Transformer(d, nhead, layers, layers, ff, dropout=0.0, batch_first=batch_first,
                           bias=options.get("bias", True))
        randomize(m, g)
        shape = (lambda n: (BATCH, n, d)) if batch_first else (lambda n: (n, BATCH, d))
        src, tgt = randn(g, *shape(ls)), randn(g, *shape(lt))
        masks = transformer_masks(src_len, ls, tgt_len, lt)

        def run():
            return m(src, tgt, tgt_mask=causal_block(lt), tgt_is_causal=True, **masks), None

        return Built(m, cfg, run, {"src": src, "tgt": tgt}, masks, dict.fromkeys(masks, "block"))

    return build


def sinusoidal_table(max_len: int, d: int) -> torch.Tensor:
    """The Annotated Transformer's table [max_len, d]."""
    position = torch.arange(max_len, dtype=F64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=F64) * -(math.log(10000.0) / d))
    pe = torch.zeros(max_len, d, dtype=F64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


class Seq2Seq(nn.Module):
    """Embeddings · √d + sinusoidal positions, nn.Transformer, a linear generator; padding id 0."""

    def __init__(self, cfg: dict):
        super().__init__()
        d = cfg["d_model"]
        self.d, self.pad = d, cfg["pad_id"]
        self.src_embed = nn.Embedding(cfg["src_vocab"], d, dtype=F64)
        self.tgt_embed = nn.Embedding(cfg["tgt_vocab"], d, dtype=F64)
        self.transformer = nn.Transformer(d, cfg["nhead"], cfg["num_encoder_layers"], cfg["num_decoder_layers"],
                                          cfg["dim_feedforward"], dropout=0.0, batch_first=True, dtype=F64)
        self.generator = nn.Linear(d, cfg["tgt_vocab"], dtype=F64)
        self.register_buffer("pe", sinusoidal_table(cfg["max_len"], d), persistent=False)

    def embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return table(ids) * math.sqrt(self.d) + self.pe[: ids.shape[1]]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_pad, lt = src == self.pad, tgt.shape[1]
        h = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt),
                             tgt_mask=causal_block(lt), tgt_is_causal=True, src_key_padding_mask=src_pad,
                             tgt_key_padding_mask=tgt == self.pad, memory_key_padding_mask=src_pad)
        return self.generator(h)


def seq2seq(g: torch.Generator) -> Built:
    """Teacher-forced logits of token ids (right padding with id 0)."""
    cfg = layer_config(16, 2, 32, num_encoder_layers=2, num_decoder_layers=2, src_vocab=11, tgt_vocab=13,
                       pad_id=0, max_len=12)
    m = Seq2Seq(cfg)
    randomize(m, g)
    src = torch.randint(1, 11, (BATCH, 7), generator=g) * ~padding([7, 5], 7)
    tgt = torch.randint(1, 13, (BATCH, 5), generator=g) * ~padding([4, 5], 5)
    return Built(m, cfg, lambda: (m(src, tgt), None), {"src": src, "tgt": tgt})


# --- Single-head and additive attention ----------------------------------------------------------------------

class SelfAttention(nn.Module):
    """One head: softmax((x·W_Qᵀ)(x·W_Kᵀ)ᵀ/√d_k + mask)·(x·W_Vᵀ), no biases."""

    def __init__(self, d_model: int, d_k: int, d_v: int):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False, dtype=F64)
        self.w_k = nn.Linear(d_model, d_k, bias=False, dtype=F64)
        self.w_v = nn.Linear(d_model, d_v, bias=False, dtype=F64)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)  # [B, L, d]
        mask = keep.unsqueeze(1)  # [B, 1, L]: true = may attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
        return out, torch.softmax(scores, dim=-1)


def self_attention(g: torch.Generator) -> Built:
    """Single head, d_k ≠ d_v, a keep-polarity key padding mask; weights."""
    cfg = dict(d_model=16, d_k=8, d_v=12, bias=False, need_weights=True)
    m = SelfAttention(16, 8, 12)
    randomize(m, g)
    x = randn(g, BATCH, 6, 16)
    keep = ~padding([6, 4], 6)
    return Built(m, cfg, lambda: m(x, keep), {"x": x}, {"key_padding_mask": keep}, {"key_padding_mask": "keep"})


class AdditiveAttention(nn.Module):
    """Bahdanau: score = w_v · tanh(W_q q + W_k k), masked, softmax over the keys."""

    def __init__(self, query_dim: int, key_dim: int, hidden: int):
        super().__init__()
        self.w_q = nn.Linear(query_dim, hidden, bias=False, dtype=F64)
        self.w_k = nn.Linear(key_dim, hidden, bias=False, dtype=F64)
        self.w_v = nn.Linear(hidden, 1, bias=False, dtype=F64)

    def forward(self, query, key, value, key_padding_mask) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.tanh(self.w_q(query).unsqueeze(2) + self.w_k(key).unsqueeze(1))  # [B, Lq, Lk, h]
        scores = self.w_v(features).squeeze(-1).masked_fill(key_padding_mask.unsqueeze(1), -math.inf)
        weights = torch.softmax(scores, dim=-1)  # [B, Lq, Lk]
        return weights @ value, weights


def additive(g: torch.Generator) -> Built:
    """Additive attention with a block-polarity key padding mask; weights."""
    cfg = dict(query_dim=10, key_dim=12, hidden=8)
    m = AdditiveAttention(10, 12, 8)
    randomize(m, g)
    query, key, value = randn(g, BATCH, 4, 10), randn(g, BATCH, 6, 12), randn(g, BATCH, 6, 5)
    kpm = padding([6, 4], 6)
    return Built(m, cfg, lambda: m(query, key, value, kpm), {"query": query, "key": key, "value": value},
                 {"key_padding_mask": kpm}, {"key_padding_mask": "block"})


def layer_norm_no_affine(g: torch.Generator) -> Built:
    """nn.LayerNorm without affine parameters (`elementwise_affine=False`)."""
    m = nn.LayerNorm(10, eps=1e-5, elementwise_affine=False)
    x = randn(g, BATCH, 3, 10)
    return Built(m, dict(dim=10, eps=1e-5, elementwise_affine=False, bias=True), lambda: (m(x), None), {"x": x})


MODULE_CASES: dict[str, tuple[str, Callable[[torch.Generator], Built]]] = {
    "mha_self_padding": ("mha", mha_self_padding),
    "mha_cross_kdim_vdim": ("mha", mha_cross_kdim_vdim),
    "mha_float_mask_nobias": ("mha", mha_float_mask_nobias),
    "mha_bias_kv_causal": ("mha", mha_bias_kv_causal),
    "mha_zero_attn_seq_first": ("mha", mha_zero_attn_seq_first),
    "mha_unbatched_bias_kv_zero_attn": ("mha", mha_unbatched_bias_kv_zero_attn),
    "gqa_causal": ("mha", gqa_case(32, 4, 2, None)),
    "gqa_rope_mqa": ("mha", gqa_case(32, 4, 1, 10000.0)),
    "gqa_rope_sinks": ("mha", gqa_case(32, 4, 2, 10000.0, sinks=True)),
    "encoder_post_relu_padding": ("encoder_layer", encoder_post_relu_padding),
    "encoder_pre_gelu_causal": ("encoder_layer", encoder_pre_gelu_causal),
    "decoder_causal_padding": ("decoder_layer", decoder_causal_padding),
    "encoder_no_bias_seq_first": ("encoder_layer", encoder_no_bias_seq_first),
    "decoder_no_bias_unbatched": ("decoder_layer", decoder_no_bias_unbatched),
    "transformer": ("transformer", transformer_case(16, 2, 32, 2, [7, 4], [3, 5])),
    # bias=False drops the final norms' biases too.
    "transformer_no_bias_seq_first": ("transformer", transformer_case(8, 2, 16, 1, [5, 3], [4, 2], bias=False,
                                                                      batch_first=False)),
    "seq2seq": ("seq2seq", seq2seq),
    "self_attention": ("self_attention", self_attention),
    "additive": ("additive", additive),
    "layer_norm_no_affine": ("layer_norm", layer_norm_no_affine),
}


# --- Position helpers ------------------------------------------------------------------------------------------

def alibi_slopes(n: int) -> list[float]:
    """The ALiBi paper's reference code (ofirpress/attention_with_linear_biases)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


def alibi(num_heads: int, lq: int, lk: int, align: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """Slopes [H] and the bias [1, H, Lq, Lk] = -m_h · |i + shift - j|, shift = Lk - Lq bottom-right."""
    slopes = torch.tensor(alibi_slopes(num_heads), dtype=F64)
    shift = lk - lq if align == "bottom_right" else 0
    distance = (torch.arange(lq).view(-1, 1) + shift - torch.arange(lk).view(1, -1)).abs().to(F64)
    bias = -slopes.view(1, -1, 1, 1) * distance
    return dict(num_heads=num_heads, lq=lq, lk=lk, align=align), {"slopes": slopes, "out": bias}


POSITION_CASES: dict[str, tuple[str, Callable[[], tuple[dict, dict[str, torch.Tensor]]]]] = {
    "alibi_8": ("alibi", lambda: alibi(8, 4, 4, "top_left")),
    "alibi_6": ("alibi", lambda: alibi(6, 3, 5, "bottom_right")),
    "sinusoidal": ("sinusoidal", lambda: (dict(max_len=10, d=16), {"out": sinusoidal_table(10, 16)})),
}


# --- Whole state dicts -----------------------------------------------------------------------------------------

STATE_DICT_DIR = OUT_DIR / "state_dicts"


def state_dict_modules() -> dict[str, nn.Module]:
    """Modules whose state dicts `crates/attn-nn/tests/loading.rs` loads as a PyTorch user saves them."""
    return {
        "encoder_layer": nn.TransformerEncoderLayer(16, 4, 32, batch_first=True),
        "mha_add_bias_kv": nn.MultiheadAttention(16, 4, add_bias_kv=True, batch_first=True),
    }


def write_state_dicts() -> int:
    """Each module of `state_dict_modules`, randomized, saved in float32 with
    `safetensors.torch.save_file(module.state_dict(), path)`; returns the bytes written."""
    STATE_DICT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in STATE_DICT_DIR.glob("*.safetensors"):
        stale.unlink()
    total = 0
    for name, module in state_dict_modules().items():
        randomize(module, seeded(f"state_dict/{name}"))
        path = STATE_DICT_DIR / f"{name}.safetensors"
        save_file({n: t.float().contiguous() for n, t in module.state_dict().items()}, path)
        total += path.stat().st_size
        print(f"state_dicts/{name:21s} {'state dict':16s} {path.stat().st_size:8d} B")
    return total


# --- Writing ---------------------------------------------------------------------------------------------------

def seeded(text: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(text.encode()))


def module_tensors(name: str, built: Built, rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Parameters, inputs, masks, expected outputs and the gradients of `(out * grad_out).sum()`;
    with `rows` ([B, L] bool), `grad_out` is zero at the output rows where it is false."""
    out, weights = built.run()
    grad_out = torch.randn(out.shape, generator=seeded(f"{name}/grad_out"), dtype=F64)
    if rows is not None:
        grad_out = grad_out * rows.unsqueeze(-1)
    params = dict(built.module.named_parameters())
    float_inputs = {n: x for n, x in built.inputs.items() if x.is_floating_point()}
    leaves = {f"input.{n}": x for n, x in float_inputs.items()} | {f"param.{n}": p for n, p in params.items()}
    grads = torch.autograd.grad((out * grad_out).sum(), list(leaves.values()))
    state = built.module.state_dict()
    assert state.keys() == params.keys(), f"{name}: the state dict holds buffers"
    tensors = {f"param.{n}": p for n, p in state.items()}
    tensors |= {f"input.{n}": x for n, x in built.inputs.items()}
    tensors |= {f"mask.{n}": m for n, m in built.masks.items()}
    tensors |= {"out": out, "grad_out": grad_out} | ({} if weights is None else {"weights": weights})
    tensors |= {f"grad.{n}": gr for n, gr in zip(leaves, grads)}
    tensors = {n: t.detach().contiguous() for n, t in tensors.items()}
    for n, t in tensors.items():
        assert not (t.is_floating_point() and t.isnan().any()), f"{name}: NaN in {n} (a fully masked row?)"
    return tensors


def write(name: str, kind: str, config: dict, tensors: dict[str, torch.Tensor], polarity: dict[str, str]) -> int:
    meta = {
        "name": name,
        "module": kind,
        "config": json.dumps(config, sort_keys=True),
        "masks": json.dumps(polarity, sort_keys=True),
        "torch_version": torch.__version__.split("+")[0],
    }
    path = OUT_DIR / f"{name}.safetensors"
    save_sorted(tensors, path, meta)
    return path.stat().st_size


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # module constructors draw initial weights; `randomize` replaces them all
    torch.set_default_dtype(F64)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in OUT_DIR.glob("*.safetensors"):
        stale.unlink()
    total = 0
    for name, (kind, build) in MODULE_CASES.items():
        built = build(seeded(name))
        built.module.eval()
        size = write(name, kind, built.config, module_tensors(name, built), built.polarity)
        total += size
        print(f"{name:32s} {kind:16s} {size:8d} B")
    for name, (kind, build) in POSITION_CASES.items():
        config, tensors = build()
        size = write(name, kind, config, tensors, {})
        total += size
        print(f"{name:32s} {kind:16s} {size:8d} B")
    total += write_state_dicts()
    print(f"{len(MODULE_CASES) + len(POSITION_CASES)} fixtures and {len(state_dict_modules())} state dicts, "
          f"{total} bytes in {OUT_DIR}")
    assert total <= MAX_TOTAL_BYTES, f"fixtures take {total} bytes, budget {MAX_TOTAL_BYTES}"


if __name__ == "__main__":
    main()
