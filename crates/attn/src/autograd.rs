//! Attention as a differentiable candle operation: a `CustomOp3` whose forward runs the fused
//! kernel and keeps its log-sum-exp (and weights, when asked) for the backward, and whose `bwd`
//! runs the fused backward kernel on that log-sum-exp, the output and the incoming gradient —
//! never recomputing the forward. Dropout is replayed from the same seed.
//!
//! Arguments: `(q, k, v)`; when the bias, the sinks or the score modification's table need a
//! gradient, `(q, kv, extra)` with `kv = [k | v]` concatenated along the last dimension and `extra`
//! the one tracked tensor, or the tracked ones flattened and joined `[bias… | sinks… | table…]`
//! (candle's `cat` and reshapes route the gradients back to `k`, `v` and each of them), since a
//! custom op takes at most three tensors. The op reads their values from its parameters, never
//! from `extra`, which only carries their gradients. The mask, key lengths and scalar options are
//! constants of the op: [`forward`] converts them to the kernels' parameters once (copying the
//! mask and bias to host memory), checks them against the sizes once, and the op's forward and
//! backward both borrow that one conversion.

use std::sync::{Arc, Mutex, MutexGuard};

use attn_kernels::alloc;
use attn_kernels::{attention, attention_backward, AttnGrads, KvView, Problem, Saved, View4};
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};

use crate::convert::{kv_view, view4};
use crate::error::{AttnLibError, Result};
use crate::options::SdpaOptions;
use crate::params::KernelParams;

/// How the op's second and third arguments hold the keys, values, bias, sinks and table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Args {
    /// `(q, k, v)`.
    Separate,
    /// `(q, [k | v], extra)`, with `Dk` columns of keys; `extra` holds the tracked ones of the
    /// bias, the sinks and the table (as flagged), flattened and joined in that order when more
    /// than one.
    Packed { dk: usize, bias: bool, sinks: bool, table: bool },
}

/// What the forward leaves for the caller and the backward (of this op and of the packed
/// sequences' op, `crate::varlen`).
#[derive(Debug, Default)]
pub(crate) struct ForwardState {
    pub(crate) lse: Vec<f32>,
    /// `lse`'s rounding residue, which makes the backward's probabilities as exact as the forward's.
    pub(crate) lse_residue: Vec<f32>,
    /// The flash path that scored the keys, which the backward scores them by again.
    pub(crate) path: Option<attn_kernels::Path>,
    pub(crate) weights: Option<Vec<f32>>,
    /// Why the forward failed, kept typed (candle's error would only carry its text).
    pub(crate) error: Option<AttnLibError>,
}

/// The differentiable attention of one call.
pub(crate) struct SdpaOp {
    /// The options in the kernels' form, made once by [`forward`].
    host: KernelParams<'static, f32>,
    args: Args,
    saved: Arc<Mutex<ForwardState>>,
}

/// Runs `opts` on 4-D `q: [B, Hq, Lq, Dk]` (f32), `k`, `v` (f32, f16 or bf16) through the op, so
/// that gradients reach `q`, `k`, `v` and, when they are tracked, the bias, the sinks and the
/// score modification's table. Returns
/// `out: [B, Hq, Lq, Dv]` (f32, differentiable), `lse: [B·Hq·Lq]` and the weights when asked.
pub(crate) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    opts: &SdpaOptions,
) -> Result<(Tensor, Vec<f32>, Option<Vec<f32>>)> {
    // The kernels' own checks first: joining `k` and `v` below would otherwise report a size
    // mismatch between them as candle's complaint about the join.
    let host = opts.kernel_params::<f32>()?.into_owned();
    let dims = |t: &Tensor| -> Result<[usize; 4]> {
        let (a, b, c, d) = t.dims4()?;
        Ok([a, b, c, d])
    };
    Problem::new(dims(q)?, dims(k)?, dims(v)?, &host.attn_params()?)?;
    let bias = opts.bias.as_ref().filter(|b| b.track_op());
    let sinks = opts.sinks.as_ref().filter(|s| s.track_op());
    let table = opts.score_mod.as_ref().and_then(|s| s.table.as_ref()).filter(|t| t.track_op());
    let tracked: Vec<&Tensor> = [bias, sinks, table].into_iter().flatten().collect();
    let (args, a2, a3) = match tracked.as_slice() {
        [] => (Args::Separate, k.clone(), v.clone()),
        parts => {
            // Contiguous: candle joins strided tensors along their last dimension into a
            // transposed layout, which the kernels' views (last dimension contiguous) cannot read.
            let kv = Tensor::cat(&[k, &v.to_dtype(k.dtype())?], 3)?.contiguous()?;
            let extra = match parts {
                [one] => (*one).clone(),
                _ => {
                    let flat = parts.iter().map(|t| t.flatten_all()?.to_dtype(DType::F32));
                    Tensor::cat(&flat.collect::<candle_core::Result<Vec<_>>>()?, 0)?
                }
            };
            let args =
                Args::Packed { dk: k.dims()[3], bias: bias.is_some(), sinks: sinks.is_some(), table: table.is_some() };
            (args, kv, extra)
        }
    };
    let saved = Arc::new(Mutex::new(ForwardState::default()));
    let op = SdpaOp { host, args, saved: saved.clone() };
    // The log-sum-exp stays with the op for its backward; the weights are taken.
    let (out, mut s) = apply_op(q, &a2, &a3, op, &saved)?;
    Ok((out, copy_lse(&s.lse)?, s.weights.take()))
}

/// Applies `op` to `(a1, a2, a3)`: its output and the state its forward left in `saved`, or the
/// typed error that forward kept there ([`failed`]).
pub(crate) fn apply_op<'s>(
    a1: &Tensor,
    a2: &Tensor,
    a3: &Tensor,
    op: impl CustomOp3 + Send + Sync + 'static,
    saved: &'s Mutex<ForwardState>,
) -> Result<(Tensor, MutexGuard<'s, ForwardState>)> {
    let out = a1.apply_op3_arc(a2, a3, Arc::new(Box::new(op)));
    let mut s = saved.lock().unwrap_or_else(|e| e.into_inner());
    match s.error.take() {
        Some(e) => Err(e),
        None => Ok((out?, s)),
    }
}

/// candle's error for a forward that failed with `e`, which is kept typed in `saved` for the
/// caller to return (candle's error would only carry its text).
pub(crate) fn failed(saved: &Mutex<ForwardState>, e: AttnLibError) -> candle_core::Error {
    let text = e.to_string();
    saved.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e);
    candle_core::Error::Msg(text)
}

/// A copy of the log-sum-exp the op keeps, allocated fallibly.
pub(crate) fn copy_lse(lse: &[f32]) -> Result<Vec<f32>> {
    Ok(alloc::collect("log-sum-exp", &[lse.len()], lse.iter().copied())?)
}

/// The CPU storage of a tensor the op received.
pub(crate) fn cpu(s: &Storage) -> Result<&CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        _ => Err(AttnLibError::Device { tensor: "q", found: "not the CPU".into() }),
    }
}

impl SdpaOp {
    /// Key and value views of arguments 2 and 3.
    fn kv<'a>(&self, s2: &'a CpuStorage, l2: &Layout, s3: &'a CpuStorage, l3: &Layout) -> Result<[KvView<'a>; 2]> {
        match self.args {
            Args::Separate => Ok([kv_view("k", s2, l2)?, kv_view("v", s3, l3)?]),
            Args::Packed { dk, .. } => {
                let dims = l2.dims();
                let dv = dims[3] - dk;
                let k = l2.clone().narrow(3, 0, dk)?;
                let v = l2.clone().narrow(3, dk, dv)?;
                Ok([kv_view("k", s2, &k)?, kv_view("v", s2, &v)?])
            }
        }
    }

    fn run_forward(&self, q: &View4<f32>, kv: [KvView; 2]) -> Result<(Vec<f32>, ForwardState)> {
        let opts = self.host.options();
        let r = attention(opts.kernel, q, &kv[0], &kv[1], &self.host.attn_params()?, opts.return_weights)?;
        Ok((
            r.out,
            ForwardState { lse: r.lse, lse_residue: r.lse_residue, path: r.path, weights: r.weights, error: None },
        ))
    }

    fn run_backward(
        &self,
        q: &Tensor,
        a2: &Tensor,
        a3: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<AttnGrads<f32>> {
        let grad = grad.to_dtype(DType::F32)?.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (s2, l2) = a2.storage_and_layout();
        let (s3, l3) = a3.storage_and_layout();
        let (os, ol) = out.storage_and_layout();
        let (gs, gl) = grad.storage_and_layout();
        let (s2c, s3c) = (cpu(&s2)?, cpu(&s3)?);
        let q = view4::<f32>("q", cpu(&qs)?, ql)?;
        let kv = self.kv(s2c, l2, s3c, l3)?;
        let out = view4::<f32>("out", cpu(&os)?, ol)?;
        let dout = view4::<f32>("grad_out", cpu(&gs)?, gl)?;
        let (lse, lse_residue, forward_path) = {
            let s = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            (copy_lse(&s.lse)?, copy_lse(&s.lse_residue)?, s.path)
        };
        let want_dbias = matches!(self.args, Args::Packed { bias: true, .. });
        Ok(attention_backward(
            self.host.options().kernel,
            &q,
            &kv[0],
            &kv[1],
            &Saved { out, lse: &lse, lse_residue: Some(&lse_residue), forward_path, dout },
            &self.host.attn_params()?,
            want_dbias,
        )?)
    }
}

impl CustomOp3 for SdpaOp {
    fn name(&self) -> &'static str {
        "attn-sdpa"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let run = || -> Result<(CpuStorage, Shape)> {
            let q = view4::<f32>("q", s1, l1)?;
            let kv = self.kv(s2, l2, s3, l3)?;
            let [b, hq, lq, _] = q.dims();
            let dv = kv[1].dims()[3];
            let (out, saved) = self.run_forward(&q, kv)?;
            *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = saved;
            Ok((CpuStorage::F32(out), Shape::from((b, hq, lq, dv))))
        };
        run().map_err(|e| failed(&self.saved, e))
    }

    fn bwd(
        &self,
        q: &Tensor,
        a2: &Tensor,
        a3: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let run = || -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let g = self.run_backward(q, a2, a3, out, grad)?;
            let (b, hq, lq, dk) = q.dims4()?;
            let dv = out.dims()[3];
            let (hkv, lk) = (a2.dims()[1], a2.dims()[2]);
            let cpu = q.device();
            let dq = Tensor::from_vec(g.dq, (b, hq, lq, dk), cpu)?;
            let dk_t = Tensor::from_vec(g.dk, (b, hkv, lk, dk), cpu)?;
            let dv_t = Tensor::from_vec(g.dv, (b, hkv, lk, dv), cpu)?;
            Ok(match self.args {
                Args::Separate => (Some(dq), Some(dk_t.to_dtype(a2.dtype())?), Some(dv_t.to_dtype(a3.dtype())?)),
                Args::Packed { bias, sinks, table, .. } => {
                    let dkv = Tensor::cat(&[dk_t, dv_t], 3)?.to_dtype(a2.dtype())?;
                    let parts = [g.dbias.filter(|_| bias), g.dsinks.filter(|_| sinks), g.dtable.filter(|_| table)];
                    let dextra: Vec<f32> = parts.into_iter().flatten().flatten().collect();
                    let dextra = Tensor::from_vec(dextra, a3.dims(), cpu)?.to_dtype(a3.dtype())?;
                    (Some(dq), Some(dkv), Some(dextra))
                }
            })
        };
        run().map_err(candle_core::Error::wrap)
    }
}
