#!/usr/bin/env python3
"""Golden fixtures of Qwen3-Next's Gated DeltaNet layer, computed by Hugging Face's own module
(`transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet`) in float64, for
`crates/attn-nn/tests/gated_delta_net.rs`.

The module runs with its PyTorch code paths (projections, short causal convolution, SiLU, the decay
`g = −exp(A_log)·softplus(a + dt_bias)`, `β = sigmoid(b)`, gated RMSNorm, output projection), except
the delta rule itself: transformers' fallback `torch_chunk_gated_delta_rule` computes in float32, so
it is replaced by the token-by-token recurrence in float64 written below (the rule of
`attn_kernels::delta`, with the L2 normalisation the layer asks for). Two of the layer's own steps
stay float32 inside the float64 module, as transformers writes them: the decay (`a.float()`) and the
gated RMSNorm (`hidden_states.to(torch.float32)`), so the fixtures agree with an exact float64 layer
to about 1e-7 relative; the Rust test's tolerance says so.

Each case becomes `crates/attn-nn/tests/fixtures/delta/<name>.safetensors` holding
- `param.<name>` (F64): the layer's parameters under transformers' names (`in_proj_qkvz.weight`,
  `in_proj_ba.weight`, `conv1d.weight`, `dt_bias`, `A_log`, `norm.weight`, `out_proj.weight`),
  drawn from a generator seeded by the case name;
- `input.x` (F64 `[B, T, E]`) and, where the case pads, `input.attention_mask` (I64 `[B, T]`, 1 =
  token, 0 = padding, as transformers' attention mask);
- `out` (F64), `grad_out` (F64, standard normal), `grad.input.x` and `grad.param.<name>`: the float64
  autograd gradients of `(out * grad_out).sum()`;
- metadata: `name`, `module` (`gated_delta_net`), `masks` (`{}`: none boolean), `config` (JSON: the
  Rust `GatedDeltaNetConfig` fields), `torch_version`,
  `transformers_version`.

Run (from the repository root, with torch and transformers installed as for
`gen_module_fixtures.py`):

    python3 scripts/gen_delta_fixtures.py
"""

from __future__ import annotations

import json
import math

import torch
import transformers
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig

from gen_fixtures import save_sorted
from gen_module_fixtures import F64, OUT_DIR, seeded

DELTA_DIR = OUT_DIR / "delta"


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrence(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
    """The gated delta rule token by token in float64: `S ← α S`, `S ← S + k ⊗ β (v − Sᵀk)`,
    `o = Sᵀ q / √Dk`, per value head (key heads repeated over their value heads)."""
    assert cu_seqlens is None
    q, k, v, g, beta = (x.to(F64) for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    b, t, hv, dv = v.shape
    group = hv // q.shape[2]
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    q = q / math.sqrt(q.shape[-1])
    s = torch.zeros(b, hv, k.shape[-1], dv, dtype=F64) if initial_state is None else initial_state.to(F64)
    outs = []
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        kt = k[:, i]
        delta = (v[:, i] - torch.einsum("bhkv,bhk->bhv", s, kt)) * beta[:, i, :, None]
        s = s + kt[..., :, None] * delta[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, i]))
    return torch.stack(outs, 1), (s if output_final_state else None)


def randomize(layer: torch.nn.Module, gen: torch.Generator) -> None:
    """Matrices ~ N(0, 1/fan_in); the convolution's taps ~ N(0, 1/K); `dt_bias` ~ N(0, 0.5²);
    `A_log` = log U(0.5, 4) (decays from mild to strong); the norm's weight ~ 1 + N(0, 0.2²)."""
    with torch.no_grad():
        for name, p in layer.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=F64)
            if name.endswith("proj_qkvz.weight") or name.endswith("proj_ba.weight") or name.startswith("out_proj"):
                p.copy_(noise / math.sqrt(p.shape[1]))
            elif name == "conv1d.weight":
                p.copy_(noise / math.sqrt(p.shape[-1]))
            elif name == "dt_bias":
                p.copy_(0.5 * noise)
            elif name == "A_log":
                p.copy_(torch.rand(p.shape, generator=gen, dtype=F64).mul(3.5).add(0.5).log())
            else:
                p.copy_(1.0 + 0.2 * noise)


# name: (hidden, key heads, value heads, key head dim, value head dim, conv kernel, batch, length,
# left padding per row or None)
CASES = {
    "gdn_grouped_left_padding": (24, 2, 4, 8, 6, 4, 2, 37, [0, 3]),
    "gdn_one_key_head_two_chunks": (16, 1, 3, 8, 4, 3, 1, 70, None),
}


def case(name: str, e: int, hk: int, hv: int, dk: int, dv: int, kernel: int, b: int, t: int,
         left: list[int] | None) -> dict[str, torch.Tensor]:
    cfg = Qwen3NextConfig(hidden_size=e, linear_num_key_heads=hk, linear_num_value_heads=hv, linear_key_head_dim=dk,
                          linear_value_head_dim=dv, linear_conv_kernel_dim=kernel, rms_norm_eps=1e-6,
                          num_hidden_layers=1, layer_types=["linear_attention"], hidden_act="silu")
    layer = qwen3_next.Qwen3NextGatedDeltaNet(cfg, 0).to(F64)
    gen = seeded(name)
    randomize(layer, gen)
    x = torch.randn(b, t, e, generator=gen, dtype=F64).requires_grad_(True)
    tensors = {"input.x": x}
    mask = None
    if left is not None:
        mask = (torch.arange(t)[None, :] >= torch.tensor(left)[:, None]).to(torch.int64)
        tensors["input.attention_mask"] = mask
    out = layer(x, attention_mask=mask)
    grad_out = torch.randn(out.shape, generator=seeded(f"{name}/grad_out"), dtype=F64)
    params = dict(layer.named_parameters())
    grads = torch.autograd.grad(out, [x, *params.values()], grad_out)
    tensors |= {"out": out, "grad_out": grad_out, "grad.input.x": grads[0]}
    for (pname, p), gp in zip(params.items(), grads[1:]):
        tensors[f"param.{pname}"] = p
        tensors[f"grad.param.{pname}"] = gp
    return {n: t.detach().contiguous() for n, t in tensors.items()}


def main() -> None:
    torch.use_deterministic_algorithms(True)
    qwen3_next.torch_chunk_gated_delta_rule = recurrence
    DELTA_DIR.mkdir(parents=True, exist_ok=True)
    for stale in DELTA_DIR.glob("*.safetensors"):
        stale.unlink()
    for name, (e, hk, hv, dk, dv, kernel, b, t, left) in CASES.items():
        tensors = case(name, e, hk, hv, dk, dv, kernel, b, t, left)
        config = {"hidden_size": e, "num_key_heads": hk, "num_value_heads": hv, "key_head_dim": dk,
                  "value_head_dim": dv, "conv_kernel_size": kernel, "rms_norm_eps": 1e-6}
        meta = {"name": name, "module": "gated_delta_net", "masks": "{}", "config": json.dumps(config, sort_keys=True),
                "torch_version": torch.__version__.split("+")[0], "transformers_version": transformers.__version__}
        path = DELTA_DIR / f"{name}.safetensors"
        save_sorted(tensors, path, meta)
        print(f"delta/{name:32s} {path.stat().st_size:8d} B")


if __name__ == "__main__":
    main()
