//! Attention as a differentiable candle operation (an [`AttnOp`], see `crate::op`): its forward
//! runs the fused kernel and keeps its log-sum-exp (and weights, when asked) for the backward; its
//! backward runs the fused backward kernel on that log-sum-exp, the output and the gradient that
//! arrived at the output, the log-sum-exp or the weights — never recomputing the forward. Dropout
//! is replayed from the same seed.
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

use std::sync::Mutex;

use attn_kernels::{attention, attention_backward, AttnGrads, KvView, Problem, Saved, SideGrads, WeightsGrad};
use candle_core::{CpuStorage, Layout, Shape, Tensor};

use crate::convert::{kv_view, view4};
use crate::error::Result;
pub(crate) use crate::op::Outputs;
use crate::op::{apply, copy_lse, cpu, lock, Args, Arrived, AttnOp, ForwardState};
use crate::options::SdpaOptions;
use crate::params::KernelParams;

/// The differentiable attention of one call.
struct SdpaOp {
    /// The options in the kernels' form, made once by [`forward`].
    host: KernelParams<'static, f32>,
    args: Args,
    saved: Mutex<ForwardState>,
}

/// Runs `opts` on 4-D `q: [B, Hq, Lq, Dk]` (f32), `k`, `v` (f32, f16 or bf16) through the op, so
/// that gradients reach `q`, `k`, `v` and, when they are tracked, the bias, the sinks and the
/// score modification's table, from `out: [B, Hq, Lq, Dv]`, `lse: [B, Hq, Lq]` and the weights
/// `[B, Hq, Lq, Lk]` when asked (all f32).
pub(crate) fn forward(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Result<Outputs> {
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
    let (args, a2, a3) = Args::new(k, v, [bias, sinks, table])?;
    apply([q, &a2, &a3], SdpaOp { host, args, saved: Mutex::default() })
}

impl SdpaOp {
    /// Key and value views of arguments 2 and 3.
    fn kv<'a>(&self, s2: &'a CpuStorage, l2: &Layout, s3: &'a CpuStorage, l3: &Layout) -> Result<[KvView<'a>; 2]> {
        let [(sk, k), (sv, v)] = self.args.kv_parts((s2, l2), (s3, l3))?;
        Ok([kv_view("k", sk, &k)?, kv_view("v", sv, &v)?])
    }

    /// The backward kernel on `q`, arguments 2 and 3, with `out` and `dout` (f32
    /// `[B, Hq, Lq, Dv]`) and the side gradients `dlse: [B·Hq·Lq]` and `dweights` (the weights and
    /// their gradient, f32 `[B, Hq, Lq, Lk]`).
    fn run_backward(
        &self,
        [q, a2, a3]: [&Tensor; 3],
        [out, dout]: [&Tensor; 2],
        dlse: Option<&[f32]>,
        dweights: Option<[&Tensor; 2]>,
    ) -> Result<AttnGrads<f32>> {
        let (qs, ql) = q.storage_and_layout();
        let (s2, l2) = a2.storage_and_layout();
        let (s3, l3) = a3.storage_and_layout();
        let (os, ol) = out.storage_and_layout();
        let (gs, gl) = dout.storage_and_layout();
        let weights = dweights.map(|w| w.map(|t| t.storage_and_layout()));
        let (s2c, s3c) = (cpu(&s2)?, cpu(&s3)?);
        let q = view4::<f32>("q", cpu(&qs)?, ql)?;
        let kv = self.kv(s2c, l2, s3c, l3)?;
        let out = view4::<f32>("out", cpu(&os)?, ol)?;
        let dout = view4::<f32>("grad_out", cpu(&gs)?, gl)?;
        let dweights = match &weights {
            Some([(ws, wl), (ds, dl)]) => Some(WeightsGrad {
                weights: view4::<f32>("weights", cpu(ws)?, wl)?,
                grad: view4::<f32>("grad_weights", cpu(ds)?, dl)?,
            }),
            None => None,
        };
        let (lse, lse_residue, forward_path) = {
            let s = lock(&self.saved);
            (copy_lse(&s.lse)?, copy_lse(&s.lse_residue)?, s.path)
        };
        let want_dbias = self.args.bias();
        let side = SideGrads { dlse, dweights };
        Ok(attention_backward(
            self.host.options().kernel,
            &q,
            &kv[0],
            &kv[1],
            &Saved { out, lse: &lse, lse_residue: Some(&lse_residue), forward_path, dout, side },
            &self.host.attn_params()?,
            want_dbias,
        )?)
    }
}

impl AttnOp for SdpaOp {
    fn name(&self) -> &'static str {
        "attn-sdpa"
    }

    fn forward(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3],
    ) -> Result<(CpuStorage, Shape, ForwardState)> {
        let q = view4::<f32>("q", s1, l1)?;
        let kv = self.kv(s2, l2, s3, l3)?;
        let [b, hq, lq, _] = q.dims();
        let (lk, dv) = (kv[0].dims()[2], kv[1].dims()[3]);
        let opts = self.host.options();
        let r = attention(opts.kernel, &q, &kv[0], &kv[1], &self.host.attn_params()?, opts.return_weights)?;
        let state = ForwardState {
            lse: r.lse,
            lse_residue: r.lse_residue,
            lse_shape: vec![b, hq, lq],
            weights_shape: vec![b, hq, lq, lk],
            path: r.path,
            weights: r.weights,
            error: None,
        };
        Ok((CpuStorage::F32(r.out), Shape::from((b, hq, lq, dv)), state))
    }

    fn backward(&self, [q, a2, a3]: [&Tensor; 3], arrived: Arrived) -> Result<[Option<Tensor>; 3]> {
        let (b, hq, lq, dk) = q.dims4()?;
        let dv = self.args.dv(a2, a3);
        let args = [q, a2, a3];
        let inc = arrived.incoming(&[b, hq, lq, dv], q.device())?;
        let dweights = inc.dweights.as_ref().map(|[w, g]| [w, g]);
        let g = self.run_backward(args, [&inc.out, &inc.dout], inc.dlse.as_deref(), dweights)?;
        let (hkv, lk) = (a2.dims()[1], a2.dims()[2]);
        let cpu = q.device();
        let dq = Tensor::from_vec(g.dq, (b, hq, lq, dk), cpu)?;
        let dk_t = Tensor::from_vec(g.dk, (b, hkv, lk, dk), cpu)?;
        let dv_t = Tensor::from_vec(g.dv, (b, hkv, lk, dv), cpu)?;
        let [d2, d3] = self.args.grads([a2, a3], [dk_t, dv_t], [g.dbias, g.dsinks, g.dtable])?;
        Ok([Some(dq), d2, d3])
    }

    fn state(&self) -> &Mutex<ForwardState> {
        &self.saved
    }
}
