//! Packed-sequence attention as a differentiable candle operation (an [`AttnOp`], see `crate::op`)
//! on `(q, k, v)`, or with sinks that take a gradient on `(q, [k | v], sinks)` (keys and values
//! joined along their last dimension, as the dense op joins them): its forward runs
//! `attn_kernels::attention_varlen` and keeps its log-sum-exp; its backward runs
//! `attention_varlen_backward` on it, the output and the gradient that arrived at the output or the
//! log-sum-exp. The offsets and the options are constants of the op, converted to the kernels'
//! form once.

use std::sync::Mutex;

use attn_kernels::{attention_varlen, attention_varlen_backward, CuSeqlens, PackedKv, VarlenSaved};
use candle_core::{CpuStorage, Layout, Shape, Tensor};

use crate::convert::{packed, packed_kv};
use crate::error::{AttnLibError, Result};
use crate::op::{apply, copy_lse, cpu, lock, Args, Arrived, AttnOp, ForwardState, Incoming, Outputs};
use crate::options::SdpaOptions;
use crate::params::KernelParams;

/// The differentiable packed attention of one call.
struct VarlenOp {
    /// The options in the kernels' form.
    host: KernelParams<'static, f32>,
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    /// `(q, k, v)`, or `(q, [k | v], sinks)` when the sinks take a gradient.
    args: Args,
    saved: Mutex<ForwardState>,
}

/// Runs `opts` on packed `q: [total_q, Hq, Dk]` (f32), `k`, `v` (f32, f16 or bf16, rank 3) cut by
/// `cu = [cu_seqlens_q, cu_seqlens_k]` through the op. Returns `out: [total_q, Hq, Dv]` and
/// `lse: [Hq, total_q]` (f32, both differentiable).
pub(super) fn forward(q: &Tensor, k: &Tensor, v: &Tensor, cu: [&[usize]; 2], opts: &SdpaOptions) -> Result<Outputs> {
    let host = opts.kernel_params::<f32>()?.into_owned();
    let (args, a2, a3) = Args::new(k, v, [None, opts.sinks.as_ref().filter(|s| s.track_op()), None])?;
    apply([q, &a2, &a3], VarlenOp { host, cu_q: cu[0].to_vec(), cu_k: cu[1].to_vec(), args, saved: Mutex::default() })
}

impl VarlenOp {
    fn cu(&self) -> CuSeqlens<'_> {
        CuSeqlens { q: &self.cu_q, k: &self.cu_k }
    }

    /// Packed key and value views of arguments 2 and 3.
    fn kv<'a>(&self, s2: &'a CpuStorage, l2: &Layout, s3: &'a CpuStorage, l3: &Layout) -> Result<[PackedKv<'a>; 2]> {
        let [(sk, k), (sv, v)] = self.args.kv_parts((s2, l2), (s3, l3))?;
        Ok([packed_kv("k", sk, &k)?, packed_kv("v", sv, &v)?])
    }
}

impl AttnOp for VarlenOp {
    fn name(&self) -> &'static str {
        "attn-sdpa-varlen"
    }

    fn forward(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [(&CpuStorage, &Layout); 3],
    ) -> Result<(CpuStorage, Shape, ForwardState)> {
        let (q, [k, v]) = (packed::<f32>("q", s1, l1)?, self.kv(s2, l2, s3, l3)?);
        let params = self.host.attn_params()?;
        let r = attention_varlen(self.host.options().kernel, &q, &k, &v, &self.cu(), &params)?;
        let [total_q, hq, _] = q.dims();
        let dv = v.dims()[2];
        let state = ForwardState {
            lse: r.lse,
            lse_residue: r.lse_residue,
            lse_shape: vec![hq, total_q],
            ..ForwardState::default()
        };
        Ok((CpuStorage::F32(r.out), Shape::from((total_q, hq, dv)), state))
    }

    fn backward(&self, [q, a2, a3]: [&Tensor; 3], arrived: Arrived) -> Result<[Option<Tensor>; 3]> {
        let (total_q, hq, _) = q.dims3()?;
        let dv = self.args.dv(a2, a3);
        let Incoming { out, dout, dlse, dweights } = arrived.incoming(&[total_q, hq, dv], q.device())?;
        if dweights.is_some() {
            let reason = "packed sequences return no weights".into();
            return Err(AttnLibError::Kernel(attn_kernels::AttnError::Param { field: "return_weights", reason }));
        }
        let [(qs, ql), (s2, l2), (s3, l3), (os, ol), (gs, gl)] =
            [q, a2, a3, &out, &dout].map(|t| t.storage_and_layout());
        let (lse, lse_residue) = {
            let s = lock(&self.saved);
            (copy_lse(&s.lse)?, copy_lse(&s.lse_residue)?)
        };
        let saved = VarlenSaved {
            out: packed("out", cpu(&os)?, ol)?,
            lse: &lse,
            lse_residue: Some(&lse_residue),
            dout: packed("grad_out", cpu(&gs)?, gl)?,
            dlse: dlse.as_deref(),
        };
        let (qv, [kv, vv]) = (packed("q", cpu(&qs)?, ql)?, self.kv(cpu(&s2)?, l2, cpu(&s3)?, l3)?);
        let params = self.host.attn_params()?;
        let g = attention_varlen_backward(self.host.options().kernel, &qv, &kv, &vv, &self.cu(), &saved, &params)?;
        let dev = q.device();
        let dq = Tensor::from_vec(g.dq, q.dims(), dev)?;
        let [total_k, hkv] = [kv.dims()[0], kv.dims()[1]];
        let dk = Tensor::from_vec(g.dk, (total_k, hkv, kv.dims()[2]), dev)?;
        let dv = Tensor::from_vec(g.dv, (total_k, hkv, dv), dev)?;
        let [d2, d3] = self.args.grads([a2, a3], [dk, dv], [None, g.dsinks, None])?;
        Ok([Some(dq), d2, d3])
    }

    fn state(&self) -> &Mutex<ForwardState> {
        &self.saved
    }
}
