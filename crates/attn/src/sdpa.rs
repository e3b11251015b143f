//! Scaled dot-product attention on candle tensors, `softmax(q·kᵀ·scale + bias, masked)·v`.
//!
//! Inputs are either 4-D, `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]` with
//! `Hq` a multiple of `Hkv` (grouped-query attention: query head `h` reads key/value head
//! `h / (Hq/Hkv)`), or 3-D single-head, `[B, L, D]`, in which case every output drops the head
//! dimension too.
//!
//! Dtypes: `f32` in gives `f32` out. `f16`, `bf16` and `f64` are accepted and computed in `f32`;
//! `out` and `weights` are cast back to `q`'s dtype, `lse` is always `f32`. Keys and values stored
//! as `f16`/`bf16` are read in place without a converted copy. Other dtypes are refused.
//! Strided tensors (transposed, narrowed, broadcast) are read in place when their last dimension
//! is contiguous, and copied to a contiguous layout otherwise.
//!
//! Device: `q`, `k` and `v` must live on the CPU (other devices are refused with an error naming
//! the tensor; copy with `.to_device(&Device::Cpu)`). Masks and biases are read from any device.
//! Results are CPU tensors.
//!
//! Gradients: `out`, `lse` and `weights` are differentiable through candle's autograd
//! (`loss.backward()`) with respect to `q`, `k`, `v`, a tracked bias, tracked sinks and a tracked
//! score-modification table (a `Var`, or computed from one): the backward runs the fused backward
//! kernel on the forward's log-sum-exp, replaying dropout from its seed (see `autograd`). A loss
//! that reads `lse` or `weights` as well as `out` runs the backward kernel once more for each
//! (`dS = A∘(dA + dW − Δ − ω + dlse)`, see `attn_kernels::SideGrads`); `weights` are those
//! before dropout, so dropout does not reach their gradient.
//!
//! Sinks ([`SdpaOptions::sinks`], `[Hq]`; `[1]` for 3-D inputs) join each row's softmax
//! denominator: the weights then sum to `1 − exp(sink − lse)` and `lse` includes the sink.

use candle_core::{DType, Tensor};

use crate::autograd;
use crate::convert::{as_key_value, as_query, check_input};
use crate::error::{AttnLibError, Result};
use crate::options::SdpaOptions;

/// Everything one attention call computes.
#[derive(Debug, Clone)]
pub struct SdpaOutput {
    /// `[B, Hq, Lq, Dv]` (3-D inputs: `[B, Lq, Dv]`), in `q`'s dtype.
    pub out: Tensor,
    /// Natural log-sum-exp of each row's scores, `[B, Hq, Lq]` (3-D inputs: `[B, Lq]`), `f32`;
    /// `-inf` for a fully masked row. With sinks it includes the row's sink,
    /// `logaddexp(lse_keys, sink_h)` (the sink itself for a fully masked row).
    pub lse: Tensor,
    /// Softmax weights before dropout, `[B, Hq, Lq, Lk]` (3-D inputs: `[B, Lq, Lk]`), in `q`'s
    /// dtype, when [`SdpaOptions::return_weights`] is set.
    pub weights: Option<Tensor>,
}

/// Scaled dot-product attention. `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`,
/// `v: [B, Hkv, Lk, Dv]` → `[B, Hq, Lq, Dv]`; or 3-D `[B, L, D]` inputs → `[B, Lq, Dv]`.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Result<Tensor> {
    Ok(sdpa_full(q, k, v, &opts.clone().return_weights(false))?.out)
}

/// Scaled dot-product attention with its statistics: the output `[B, Hq, Lq, Dv]`, the
/// log-sum-exp `[B, Hq, Lq]` and, when asked, the weights `[B, Hq, Lq, Lk]` (3-D inputs `[B, L, D]`
/// drop the head dimension of each). Shapes as in [`sdpa`].
pub fn sdpa_full(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Result<SdpaOutput> {
    let single_head = single_head(q, k, v)?;
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        check_input(name, t)?;
    }
    let lift = |t: &Tensor| if single_head { t.unsqueeze(1) } else { Ok(t.clone()) };
    let (q4, k4, v4) = (as_query(&lift(q)?)?, as_key_value(&lift(k)?)?, as_key_value(&lift(v)?)?);

    let lifted = if single_head { Some(with_head_dim(opts)?) } else { None };
    let opts = lifted.as_ref().unwrap_or(opts);
    let autograd::Outputs { out, lse, weights } = autograd::forward(&q4, &k4, &v4, opts)?;

    let dtype = q.dtype();
    let fit = |t: Tensor, dtype| -> Result<Tensor> {
        let t = if single_head { t.squeeze(1)? } else { t };
        Ok(if t.dtype() == dtype { t } else { t.to_dtype(dtype)? })
    };
    Ok(SdpaOutput {
        out: fit(out, dtype)?,
        lse: fit(lse, DType::F32)?,
        weights: weights.map(|w| fit(w, dtype)).transpose()?,
    })
}

/// Whether the inputs are 3-D single-head; refuses ranks other than all 3 or all 4.
fn single_head(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<bool> {
    let rank = q.rank();
    if rank != 3 && rank != 4 {
        return Err(AttnLibError::Shape {
            tensor: "q",
            found: q.dims().to_vec(),
            expected: "rank 4 [B, Hq, Lq, Dk] or rank 3 [B, Lq, Dk]".into(),
        });
    }
    for (name, t, what) in [("k", k, "Lk, Dk"), ("v", v, "Lk, Dv")] {
        if t.rank() != rank {
            let expected = if rank == 4 { format!("rank 4 [B, Hkv, {what}]") } else { format!("rank 3 [B, {what}]") };
            return Err(AttnLibError::Shape {
                tensor: name,
                found: t.dims().to_vec(),
                expected: format!("{expected}, like q"),
            });
        }
    }
    Ok(rank == 3)
}

/// `opts` for 3-D inputs lifted to one head: a rank-3 mask or bias `[B, Lq, Lk]` becomes
/// `[B, 1, Lq, Lk]`; other ranks broadcast as they are.
fn with_head_dim(opts: &SdpaOptions) -> Result<SdpaOptions> {
    let lift = |t: &Tensor| if t.rank() == 3 { t.unsqueeze(1) } else { Ok(t.clone()) };
    let mask = opts.mask.as_ref().map(|m| lift(m.tensor()).map(|t| m.with_tensor(t))).transpose()?;
    let bias = opts.bias.as_ref().map(lift).transpose()?;
    Ok(SdpaOptions { mask, bias, ..opts.clone() })
}
