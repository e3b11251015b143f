//! `attn run`: reads `q`, `k`, `v` (and optionally `mask`, `bias`, `key_lengths`, `sinks`,
//! `grad_out`) from one safetensors file or `.npz` archive, or from `.npy` files, computes attention
//! with [`attn::sdpa_full`] under the shared attention flags, and writes `out`, `lse` (and `weights`
//! with the keep-mask `mask` of the cells masking set to 0) to a safetensors file or `.npz`
//! archive, as the output's extension says; with `grad_out`, also the gradients `dq`, `dk`, `dv`
//! (and `dbias`, `dsinks`) through the library's autograd (`loss = Σ out·grad_out`,
//! `loss.backward()`). An INPUT file holding `cu_seqlens_q` and `cu_seqlens_k` asks for packed
//! variable-length sequences instead ([`attn::sdpa_varlen_full`]; see `packed`).
//! Every refusal is one line naming the file, the tensor and what was expected versus found, and
//! comes before anything is computed or written (the output's extension is checked before the
//! inputs are read), as is an output that is one of the inputs. The work runs in a pool of
//! `--threads` threads; the output line names the kernel `auto` resolved to and the dropout seed.
//! `--pattern` adds a named block-sparse pattern's block mask, built for the inputs' `Lq × Lk`
//! (the output line gives its parameters and the fraction of 64×64 blocks it lists).
//! `--delta-rule` runs the gated delta rule on its own inputs instead (see `delta`).

mod delta;
mod inputs;
mod linear;
#[cfg(test)]
mod options_spelled;
mod packed;
mod sourced;

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::sdpa_flags::SdpaFlags;
use super::threads::Threads;
use crate::io::{check_not_an_input, write_tensors, HostTensor, IoError, TensorFormat};
pub use delta::DeltaRule;
use inputs::Inputs;
use linear::LinearMap;

/// Arguments of `attn run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Safetensors file or `.npz` archive (`np.savez(f, q=q, k=k, v=v)`, compressed or not) holding
    /// `q: [B, Hq, Lq, D]`, `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`
    /// and optionally `mask` (BOOL/U8, broadcastable to `[B, Hq, Lq, Lk]`), `bias` (float,
    /// broadcastable), `key_lengths` (I32/I64, `[B]`), `sinks` (float, `[Hq]`: gpt-oss's learned
    /// attention sinks, one logit per query head joining its rows' softmax denominator) and
    /// `grad_out` (float, `[B, Hq, Lq, Dv]`: the gradient of the output, which asks for the
    /// gradients). Packed variable-length sequences: `cu_seqlens_q` and `cu_seqlens_k` (I32/I64,
    /// `[B+1]`, FlashAttention's offsets) with `q: [total_q, Hq, D]`, `k: [total_k, Hkv, D]`,
    /// `v: [total_k, Hkv, Dv]` (and `grad_out: [total_q, Hq, Dv]`); the masking flags then apply
    /// within each sequence, `sinks` join every sequence's rows, and `mask`, `bias`, `key_lengths`
    /// and `--weights` are refused.
    #[arg(required_unless_present = "q", conflicts_with = "q")]
    pub input: Option<PathBuf>,
    /// Output file, in the format its extension names: `.safetensors`/`.st` or `.npz` (one
    /// `NAME.npy` member per tensor, for `np.load`). It holds `out: [B, Hq, Lq, Dv]` and
    /// `lse: [B, Hq, Lq]`; with `--weights` also `weights: [B, Hq, Lq, Lk]` and
    /// `mask: [B, Hq, Lq, Lk]` (BOOL, true where the query may attend the key: mask, key lengths,
    /// causal band, window and −∞ bias together, which `attn heatmap` uses to draw masked cells
    /// apart from small weights); when `grad_out` is given, `dq: [B, Hq, Lq, D]`, `dk: [B, Hkv, Lk, D]`,
    /// `dv: [B, Hkv, Lk, Dv]`, with a bias `dbias` (the bias's shape) and with sinks
    /// `dsinks: [Hq]`; packed sequences give `out: [total_q, Hq, Dv]`, `lse: [Hq, total_q]` and
    /// gradients in their inputs' shapes. All floats are F32. The gradients are those of
    /// `Σ out·grad_out` through the library's autograd, by the backward of `--kernel`, with dropout
    /// replayed from `--seed`; `dk`, `dv`, `dbias` and `dsinks` come in the stored precision of `k`,
    /// `v`, the bias and the sinks. With sinks, `lse` includes them and a row's weights sum to less
    /// than 1.
    #[arg(short, long)]
    pub output: PathBuf,
    /// `.npy` file of `q: [B, Hq, Lq, D]`, instead of INPUT.
    #[arg(long, requires_all = ["k", "v"])]
    pub q: Option<PathBuf>,
    /// `.npy` file of `k: [B, Hkv, Lk, D]`.
    #[arg(long, requires = "q")]
    pub k: Option<PathBuf>,
    /// `.npy` file of `v: [B, Hkv, Lk, Dv]`.
    #[arg(long, requires = "q")]
    pub v: Option<PathBuf>,
    /// `.npy` file of the boolean mask (true = may attend), broadcastable to `[B, Hq, Lq, Lk]`.
    #[arg(long, requires = "q")]
    pub mask: Option<PathBuf>,
    /// `.npy` file of the additive bias, broadcastable to `[B, Hq, Lq, Lk]`.
    #[arg(long, requires = "q")]
    pub bias: Option<PathBuf>,
    /// `.npy` file of the valid key count per batch, `[B]`.
    #[arg(long, requires = "q")]
    pub key_lengths: Option<PathBuf>,
    /// `.npy` file of the attention sinks' logits, float `[Hq]`.
    #[arg(long, requires = "q")]
    pub sinks: Option<PathBuf>,
    /// `.npy` file of the output's gradient `grad_out: [B, Hq, Lq, Dv]` (float): also write `dq`,
    /// `dk`, `dv` (and `dbias`).
    #[arg(long, requires = "q")]
    pub grad_out: Option<PathBuf>,
    #[command(flatten)]
    pub sdpa: SdpaFlags,
    /// Linear attention with this feature map instead of softmax attention:
    /// `out_i = φ(q_i)·Σ_j φ(k_j) v_jᵀ / (φ(q_i)·Σ_j φ(k_j) + 1e-6)` over the keys `j` (`j ≤ i` with
    /// `--causal`, which needs `Lq = Lk`; keys beyond `key_lengths` left out), `φ` applied to `q`
    /// and `k` as given (no `1/√D` scale). Writes `out` (no `lse`) and, with `grad_out`, `dq`,
    /// `dk`, `dv`; takes no mask, bias, sinks or packed sequences.
    #[arg(long, value_name = "MAP", conflicts_with_all = ["weights", "window", "scale", "softcap", "dropout", "align"])]
    pub linear: Option<LinearMap>,
    /// The gated delta rule instead of attention (`gated`: Gated DeltaNet, `kda`: Kimi Delta
    /// Attention), fla's conventions: per value head a state `S: [Dk, Dv]`, decayed by `exp(g_t)`
    /// (per key channel for `kda`), then `S += k_t ⊗ β_t (v_t − Sᵀk_t)` and `o_t = Sᵀ (scale · q_t)`
    /// (`--scale`, default `1/√Dk`). INPUT holds `q, k: [B, T, Hk, Dk]`, `v: [B, T, Hv, Dv]`
    /// (`Hv` a multiple of `Hk`), `g ≤ 0` (`[B, T, Hv]`; `kda`: `[B, T, Hv, Dk]`), `beta: [B, T,
    /// Hv]`, optionally `initial_state: [N, Hv, Dk, Dv]`, `cu_seqlens` (I32/I64 `[N + 1]`, packed
    /// sequences with `B = 1`, each from its own state) and `grad_out: [B, T, Hv, Dv]`. Writes
    /// `out: [B, T, Hv, Dv]`, `final_state: [N, Hv, Dk, Dv]` and, with `grad_out`, `dq`, `dk`,
    /// `dv`, `dg`, `dbeta` (and `dinitial_state`).
    #[arg(long, value_name = "RULE", requires = "input", conflicts_with_all = [
        "linear", "weights", "causal", "window", "softcap", "dropout", "align", "kernel", "compute", "pattern",
    ])]
    pub delta_rule: Option<DeltaRule>,
    /// With `--delta-rule`: L2-normalise `q` and `k` inside the rule (fla's
    /// `use_qk_l2norm_in_kernel`, as Qwen3-Next and Kimi Linear call it).
    #[arg(long, requires = "delta_rule")]
    pub qk_l2norm: bool,
    /// Also write the attention weights (before dropout).
    #[arg(long)]
    pub weights: bool,
    #[command(flatten)]
    pub threads: Threads,
}

impl Args {
    /// Every input file named on the command line.
    fn input_files(&self) -> impl Iterator<Item = &Path> {
        let npy = [&self.q, &self.k, &self.v, &self.mask, &self.bias, &self.key_lengths, &self.sinks, &self.grad_out];
        std::iter::once(&self.input).chain(npy).filter_map(|p| p.as_deref())
    }
}

/// Runs `attn run`.
pub fn main(args: Args) -> Result<()> {
    check_not_an_input(&args.output, args.input_files())?;
    let format = TensorFormat::for_output(&args.output)?;
    let pool = args.threads.pool()?;
    if let (Some(rule), Some(input)) = (args.delta_rule, &args.input) {
        return pool.install(|| delta::main(&args, rule, input, format));
    }
    let pattern = args.sdpa.pattern()?;
    let inputs = match &args.input {
        Some(path) => Inputs::from_file(path)?,
        None => Inputs::from_npy(&args)?,
    };
    let described = inputs.describe();
    let linear = args.linear.map(|m| m.options(args.sdpa.causal));
    if let (Some(_), Some(p)) = (&linear, &pattern) {
        anyhow::bail!("--pattern {p}: linear attention (--linear) takes no block-sparse pattern");
    }
    let mut call = inputs.into_call(args.sdpa.options().return_weights(args.weights), linear)?;
    let pattern_text = match &pattern {
        Some(p) => format!(", pattern {p} ({:.4} of blocks)", call.set_pattern(p)?),
        None => String::new(),
    };
    let calls = call.calls();
    let result = pool.install(|| call.run())?;
    let file = args.output.display().to_string();
    let mut named = vec![("out", &result.out)];
    named.extend(result.lse.iter().map(|t| ("lse", t)));
    named.extend(result.weights.iter().map(|t| ("weights", t)));
    named.extend(result.grads.iter().map(|(n, t)| (*n, t)));
    let mut tensors = named
        .into_iter()
        .map(|(n, t)| Ok((n, HostTensor::from_f32_tensor(t, n).map_err(|kind| IoError::tensor(&file, n, kind))?)))
        .collect::<Result<Vec<_>, IoError>>()?;
    if let Some(keep) = &result.keep {
        tensors.push((
            "mask",
            HostTensor::from_keep_tensor(keep, "mask").map_err(|kind| IoError::tensor(&file, "mask", kind))?,
        ));
    }
    let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    write_tensors(&args.output, format, &refs)?;
    let shapes: Vec<String> = tensors.iter().map(|(n, t)| format!("{n} {:?}", t.shape)).collect();
    let dropout = args.sdpa.dropout_text().map_or(String::new(), |d| format!(", {d}"));
    let kernel = match args.linear {
        Some(m) => {
            let causal = if args.sdpa.causal { "causal" } else { "non-causal" };
            format!("linear {} ({causal})", m.options(false).map.name())
        }
        None => format!("{} kernel", args.sdpa.kernel_text(&calls)),
    };
    println!(
        "{described} -> {kernel}{dropout}{pattern_text} -> {} written to {}",
        shapes.join(", "),
        args.output.display()
    );
    Ok(())
}
