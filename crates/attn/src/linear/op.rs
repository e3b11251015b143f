//! Linear attention as a differentiable candle operation: a `CustomOp3` on `(q, k, v)` whose
//! forward runs `attn_kernels::linear::linear_attention` and whose `bwd` runs the fused backward on
//! the inputs, the output and the incoming gradient, in `f32` or `f64` as the inputs are. The
//! options are constants of the op; a kernel's refusal is kept typed for the caller.

use std::sync::{Arc, Mutex};

use attn_kernels::linear::{linear_attention as kernel, linear_attention_backward};
use attn_kernels::{Real, View4};
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor, WithDType};

use super::LinearOptions;
use crate::convert::view4;
use crate::error::Result;
use crate::op::{apply_op, cpu, failed, ForwardState};

struct LinearOp {
    opts: LinearOptions,
    /// Where the forward keeps why it failed, typed ([`failed`]).
    saved: Arc<Mutex<ForwardState>>,
}

/// Runs the op on contiguous `f32` or `f64` tensors of one dtype.
pub(super) fn forward(q: &Tensor, k: &Tensor, v: &Tensor, opts: &LinearOptions) -> Result<Tensor> {
    let saved = Arc::new(Mutex::new(ForwardState::default()));
    let op = LinearOp { opts: opts.clone(), saved: saved.clone() };
    let (out, state) = apply_op(q, k, v, op, &saved)?;
    drop(state);
    Ok(out)
}

impl LinearOp {
    fn fwd<T: Real + WithDType>(&self, s: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape)> {
        let [q, k, v] = [("q", s[0]), ("k", s[1]), ("v", s[2])].map(|(n, (c, l))| view4::<T>(n, c, l));
        let (q, k, v) = (q?, k?, v?);
        let out = kernel(q, k, v, &self.opts.params())?;
        let [b, hq, lq, _] = q.dims();
        Ok((T::to_cpu_storage_owned(out), Shape::from((b, hq, lq, v.dims()[3]))))
    }

    fn bwd_typed<T: Real + WithDType>(&self, t: [&Tensor; 5]) -> Result<[Tensor; 3]> {
        let mut c = Vec::with_capacity(5);
        for x in t {
            c.push(x.to_dtype(T::DTYPE)?.contiguous()?);
        }
        let (q, k, v) = (&c[0], &c[1], &c[2]);
        let guards: Vec<_> = c.iter().map(|x| x.storage_and_layout()).collect();
        let names = ["q", "k", "v", "out", "grad_out"];
        let mut views: Vec<View4<T>> = Vec::with_capacity(5);
        for (name, (s, l)) in names.into_iter().zip(&guards) {
            views.push(view4::<T>(name, cpu(s)?, l)?);
        }
        let g = linear_attention_backward(views[0], views[1], views[2], views[3], views[4], &self.opts.params())?;
        let dev = q.device();
        Ok([
            Tensor::from_vec(g.dq, q.dims(), dev)?,
            Tensor::from_vec(g.dk, k.dims(), dev)?,
            Tensor::from_vec(g.dv, v.dims(), dev)?,
        ])
    }
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "attn-linear"
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
        let s = [(s1, l1), (s2, l2), (s3, l3)];
        let r = match s1 {
            CpuStorage::F64(_) => self.fwd::<f64>(s),
            _ => self.fwd::<f32>(s),
        };
        r.map_err(|e| failed(&self.saved, e))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let t = [q, k, v, out, grad];
        let r = if q.dtype() == candle_core::DType::F64 { self.bwd_typed::<f64>(t) } else { self.bwd_typed::<f32>(t) };
        let [dq, dk, dv] = r.map_err(candle_core::Error::wrap)?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
