//! `attn run INPUT --delta-rule gated|kda`: the gated delta rule ([`attn::delta_rule`]: Gated
//! DeltaNet's scalar decay, or Kimi Delta Attention's per-channel one) on `q, k: [B, T, Hk, Dk]`,
//! `v: [B, T, Hv, Dv]`, `g` (`[B, T, Hv]`, or `[B, T, Hv, Dk]` for KDA), `beta: [B, T, Hv]`, an
//! optional `initial_state: [N, Hv, Dk, Dv]` and packed sequences' `cu_seqlens` (`B = 1`), read
//! from one safetensors file or `.npz` archive; it writes `out` and `final_state` and, with
//! `grad_out: [B, T, Hv, Dv]`, the gradients of `Σ out·grad_out` (`dq`, `dk`, `dv`, `dg`,
//! `dbeta`, and `dinitial_state` with an initial state) through the library's autograd. Inputs
//! compute in `f32`. Refusals are one line naming the file and the tensor.

use std::path::Path;

use anyhow::{anyhow, Result};
use attn::delta::{delta_rule, DeltaOptions, DeltaParams, Gate};
use candle_core::{DType, Tensor, Var};

use super::packed::rank1_counts;
use super::Args;
use crate::io::{read_tensors, write_tensors, HostTensor, IoError, IoErrorKind, TensorFormat};

/// The rules `--delta-rule` names.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaRule {
    /// Gated DeltaNet: one decay per value head and token, `g: [B, T, Hv]`.
    Gated,
    /// Kimi Delta Attention: one decay per key channel, `g: [B, T, Hv, Dk]`.
    Kda,
}

impl DeltaRule {
    /// The kernels' gate of this rule.
    pub fn gate(self) -> Gate {
        match self {
            DeltaRule::Gated => Gate::Scalar,
            DeltaRule::Kda => Gate::Channel,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DeltaRule::Gated => "gated delta rule",
            DeltaRule::Kda => "KDA delta rule",
        }
    }

    /// The flag's value, `gated` or `kda`.
    pub fn flag(self) -> &'static str {
        match self {
            DeltaRule::Gated => "gated",
            DeltaRule::Kda => "kda",
        }
    }
}

/// Tensor names accepted in the input file.
const ACCEPTED: [&str; 8] = ["q", "k", "v", "g", "beta", "initial_state", "grad_out", "cu_seqlens"];

/// Runs `attn run --delta-rule` on `input`, writing to `args.output` in `format`.
pub(super) fn main(args: &Args, rule: DeltaRule, input: &Path, format: TensorFormat) -> Result<()> {
    let file = input.display().to_string();
    let mut map = read_tensors(input)?;
    if let Some(name) = map.keys().find(|n| !ACCEPTED.contains(&n.as_str())) {
        return Err(IoError::tensor(&file, name, IoErrorKind::Unknown { accepted: ACCEPTED.join(", ") }).into());
    }
    let described: Vec<String> = map.iter().map(|(n, t)| format!("{n} {:?} {}", t.shape, t.dtype_name())).collect();
    let found = map.keys().cloned().collect::<Vec<_>>().join(", ");
    let g_rank = if rule == DeltaRule::Kda { 4 } else { 3 };
    let mut take = |name: &'static str, rank: usize, dims: &str| -> Result<Option<Tensor>, IoError> {
        let Some(t) = map.remove(name) else { return Ok(None) };
        let converted = if t.shape.len() == rank {
            t.into_f32_tensor()
        } else {
            Err(IoErrorKind::Shape { found: t.shape, expected: format!("rank {rank} {dims}") })
        };
        converted.map(Some).map_err(|kind| IoError::tensor(&file, name, kind))
    };
    let missing = |name: &str| IoError::tensor(&file, name, IoErrorKind::Missing { found: found.clone() });
    let mut need = |name: &'static str, rank: usize, dims: &str| take(name, rank, dims)?.ok_or_else(|| missing(name));
    let q = need("q", 4, "[B, T, Hk, Dk]")?;
    let k = need("k", 4, "[B, T, Hk, Dk]")?;
    let v = need("v", 4, "[B, T, Hv, Dv]")?;
    let g = need("g", g_rank, if g_rank == 4 { "[B, T, Hv, Dk] (KDA)" } else { "[B, T, Hv]" })?;
    let beta = need("beta", 3, "[B, T, Hv]")?;
    let initial_state = take("initial_state", 4, "[N, Hv, Dk, Dv]")?;
    let grad_out = take("grad_out", 4, "[B, T, Hv, Dv]")?;
    if let Some(go) = &grad_out {
        if go.dims() != v.dims() {
            let kind = IoErrorKind::Shape { found: go.dims().to_vec(), expected: format!("{:?} (v's)", v.dims()) };
            return Err(IoError::tensor(&file, "grad_out", kind).into());
        }
    }
    let cu_seqlens = map
        .remove("cu_seqlens")
        .map(|t| rank1_counts(t, "[N + 1]").map_err(|kind| IoError::tensor(&file, "cu_seqlens", kind)))
        .transpose()?;
    let opts = DeltaOptions {
        params: DeltaParams { scale: args.sdpa.scale, l2norm_qk: args.qk_l2norm, gate: rule.gate() },
        cu_seqlens,
    };
    let refused = |e: attn::AttnLibError| {
        let text = e.to_string();
        anyhow!("{file}: {}", text.lines().next().unwrap_or_default())
    };
    let candle = |e: candle_core::Error| refused(e.into());
    let (out, final_state, grads) = match &grad_out {
        None => {
            let r = delta_rule(&q, &k, &v, &g, &beta, initial_state.as_ref(), &opts).map_err(refused)?;
            (r.out, r.final_state, Vec::new())
        }
        Some(go) => {
            let var = |t: &Tensor| Var::from_tensor(t).map_err(candle);
            let vars = [("dq", var(&q)?), ("dk", var(&k)?), ("dv", var(&v)?), ("dg", var(&g)?), ("dbeta", var(&beta)?)];
            let init = initial_state.as_ref().map(var).transpose()?;
            let [q, k, v, g, beta] = vars.each_ref().map(|(_, v)| v.as_tensor());
            let r = delta_rule(q, k, v, g, beta, init.as_ref().map(|v| v.as_tensor()), &opts).map_err(refused)?;
            let store = (&r.out * go).and_then(|l| l.sum_all()).and_then(|l| l.backward()).map_err(candle)?;
            let with_init = vars.iter().map(|(n, v)| (*n, v)).chain(init.iter().map(|v| ("dinitial_state", v)));
            let grads = with_init
                .map(|(name, var)| {
                    let grad = store.get(var).ok_or_else(|| anyhow!("{file}: no gradient reached {name}"))?;
                    Ok((name, grad.to_dtype(DType::F32).map_err(candle)?))
                })
                .collect::<Result<Vec<_>>>()?;
            (r.out, r.final_state, grads)
        }
    };
    let written = args.output.display().to_string();
    let named = [("out", &out), ("final_state", &final_state)].into_iter().chain(grads.iter().map(|(n, t)| (*n, t)));
    let tensors = named
        .map(|(n, t)| Ok((n, HostTensor::from_f32_tensor(t, n).map_err(|kind| IoError::tensor(&written, n, kind))?)))
        .collect::<Result<Vec<_>, IoError>>()?;
    let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    write_tensors(&args.output, format, &refs)?;
    let shapes: Vec<String> = tensors.iter().map(|(n, t)| format!("{n} {:?}", t.shape)).collect();
    let l2 = if args.qk_l2norm { ", q and k L2-normalised" } else { "" };
    println!(
        "{} -> {} (chunked, f32{l2}) -> {} written to {written}",
        described.join(", "),
        rule.name(),
        shapes.join(", ")
    );
    Ok(())
}
