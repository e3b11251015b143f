//! Packed-sequence attention as a differentiable candle operation: a `CustomOp3` on `(q, k, v)`
//! whose forward runs `attn_kernels::attention_varlen` and keeps its log-sum-exp, and whose `bwd`
//! runs `attention_varlen_backward` on it, the output and the incoming gradient. The offsets and
//! the options are constants of the op, converted to the kernels' form once.

use std::sync::{Arc, Mutex};

use attn_kernels::{attention_varlen, attention_varlen_backward, AttnGrads, CuSeqlens, VarlenSaved};
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};

use crate::autograd::{apply_op, copy_lse, cpu, failed, ForwardState};
use crate::convert::{packed, packed_kv};
use crate::error::Result;
use crate::options::SdpaOptions;
use crate::params::KernelParams;

/// The differentiable packed attention of one call.
struct VarlenOp {
    /// The options in the kernels' form.
    host: KernelParams<'static, f32>,
    cu_q: Vec<usize>,
    cu_k: Vec<usize>,
    saved: Arc<Mutex<ForwardState>>,
}

/// Runs `opts` on packed `q: [total_q, Hq, Dk]` (f32), `k`, `v` (f32, f16 or bf16, rank 3) cut by
/// `cu = [cu_seqlens_q, cu_seqlens_k]` through the op. Returns `out: [total_q, Hq, Dv]` (f32,
/// differentiable) and `lse: [Hq·total_q]`.
pub(super) fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu: [&[usize]; 2],
    opts: &SdpaOptions,
) -> Result<(Tensor, Vec<f32>)> {
    let host = opts.kernel_params::<f32>()?.into_owned();
    let saved = Arc::new(Mutex::new(ForwardState::default()));
    let op = VarlenOp { host, cu_q: cu[0].to_vec(), cu_k: cu[1].to_vec(), saved: saved.clone() };
    let (out, s) = apply_op(q, k, v, op, &saved)?;
    Ok((out, copy_lse(&s.lse)?))
}

impl VarlenOp {
    fn cu(&self) -> CuSeqlens<'_> {
        CuSeqlens { q: &self.cu_q, k: &self.cu_k }
    }

    fn run_backward(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, grad: &Tensor) -> Result<AttnGrads<f32>> {
        let grad = grad.to_dtype(DType::F32)?.contiguous()?;
        let [(qs, ql), (ks, kl), (vs, vl), (os, ol), (gs, gl)] = [q, k, v, out, &grad].map(|t| t.storage_and_layout());
        let (lse, lse_residue) = {
            let s = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            (copy_lse(&s.lse)?, copy_lse(&s.lse_residue)?)
        };
        let saved = VarlenSaved {
            out: packed("out", cpu(&os)?, ol)?,
            lse: &lse,
            lse_residue: Some(&lse_residue),
            dout: packed("grad_out", cpu(&gs)?, gl)?,
        };
        let (qv, kv, vv) =
            (packed("q", cpu(&qs)?, ql)?, packed_kv("k", cpu(&ks)?, kl)?, packed_kv("v", cpu(&vs)?, vl)?);
        let params = self.host.attn_params()?;
        Ok(attention_varlen_backward(self.host.options().kernel, &qv, &kv, &vv, &self.cu(), &saved, &params)?)
    }
}

impl CustomOp3 for VarlenOp {
    fn name(&self) -> &'static str {
        "attn-sdpa-varlen"
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
            let (q, k, v) = (packed::<f32>("q", s1, l1)?, packed_kv("k", s2, l2)?, packed_kv("v", s3, l3)?);
            let params = self.host.attn_params()?;
            let r = attention_varlen(self.host.options().kernel, &q, &k, &v, &self.cu(), &params)?;
            let [total_q, hq, _] = q.dims();
            let dv = v.dims()[2];
            let state = ForwardState { lse: r.lse, lse_residue: r.lse_residue, ..ForwardState::default() };
            *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = state;
            Ok((CpuStorage::F32(r.out), Shape::from((total_q, hq, dv))))
        };
        run().map_err(|e| failed(&self.saved, e))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let run = || -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
            let g = self.run_backward(q, k, v, out, grad)?;
            let dev = q.device();
            let dq = Tensor::from_vec(g.dq, q.dims(), dev)?;
            let dk = Tensor::from_vec(g.dk, k.dims(), dev)?.to_dtype(k.dtype())?;
            let dv = Tensor::from_vec(g.dv, v.dims(), dev)?.to_dtype(v.dtype())?;
            Ok((Some(dq), Some(dk), Some(dv)))
        };
        run().map_err(candle_core::Error::wrap)
    }
}
