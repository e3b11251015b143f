//! The gated delta rule (`attn_kernels::delta`: Gated DeltaNet, and KDA's per-channel decay) on
//! candle tensors, differentiable: [`delta_rule`] runs the chunked kernels in `f32` (or the exact
//! recurrence in `f64`, for `f64` inputs) and its backward the chunked backward, so gradients
//! reach `q`, `k`, `v`, `g`, `beta` and the initial state through candle's autograd.
//!
//! A custom op takes at most three tensors, so the op's one argument is the inputs flattened and
//! joined (`[q… | k… | v… | g… | beta… | initial_state…]`) and its one result the output and the
//! final state joined; candle's `cat`, `narrow` and `reshape` route the gradients back to each.

use std::sync::{Arc, Mutex};

use attn_kernels::delta::{
    delta_rule as chunked, delta_rule_backward, delta_rule_reference, delta_rule_reference_backward, DeltaDims,
    DeltaGrads, DeltaInputs, DeltaOutput,
};
pub use attn_kernels::delta::{DeltaParams, Gate};
use attn_kernels::{AttnError, Real};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor, WithDType};

use crate::error::Result;
use crate::op::{cpu, failed, lock, ForwardState};

/// Options of [`delta_rule`]: the kernels' parameters (scale, L2 normalisation, gate) and packed
/// sequences.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeltaOptions {
    pub params: DeltaParams,
    /// fla's `cu_seqlens` (with `B = 1`): sequence `n` is tokens `cu[n]..cu[n + 1]`, from its own
    /// state.
    pub cu_seqlens: Option<Vec<usize>>,
}

/// What [`delta_rule`] returns.
#[derive(Debug, Clone)]
pub struct DeltaResult {
    /// `[B, T, Hv, Dv]`.
    pub out: Tensor,
    /// `[N, Hv, Dk, Dv]`.
    pub final_state: Tensor,
}

/// The gated delta rule on `q, k: [B, T, Hk, Dk]`, `v: [B, T, Hv, Dv]`, `g: [B, T, Hv]` (or
/// `[B, T, Hv, Dk]` with the channel gate), `beta: [B, T, Hv]` and an optional `initial_state:
/// [N, Hv, Dk, Dv]` (the semantics of `attn_kernels::delta`), in `f64` when `q` is, else `f32`.
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    initial_state: Option<&Tensor>,
    opts: &DeltaOptions,
) -> Result<DeltaResult> {
    let (b, t, hk, dk) = q.dims4()?;
    let (_, _, hv, dv) = v.dims4()?;
    let d = DeltaDims { b, t, hk, hv, dk, dv };
    let sequences = opts.cu_seqlens.as_ref().map_or(b, |c| c.len().saturating_sub(1));
    let lens = Lens::new(&d, opts, sequences, initial_state.is_some());
    let dtype = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
    let named = [("q", Some(q)), ("k", Some(k)), ("v", Some(v)), ("g", Some(g)), ("beta", Some(beta))];
    let mut parts = Vec::with_capacity(6);
    for ((name, x), &want) in named.into_iter().chain([("initial_state", initial_state)]).zip(&lens.inputs) {
        if let Some(x) = x {
            if x.elem_count() != want {
                return Err(AttnError::DimMismatch {
                    tensor: name,
                    dim: "length",
                    expected: want,
                    found: x.elem_count(),
                }
                .into());
            }
            parts.push(x.to_dtype(dtype)?.flatten_all()?);
        }
    }
    let flat = Tensor::cat(&parts, 0)?;
    let saved = Arc::new(Mutex::new(ForwardState::default()));
    let op = DeltaOp { d, opts: opts.clone(), lens: lens.clone(), saved: saved.clone() };
    let res = flat.apply_op1_arc(Arc::new(Box::new(op)));
    if let Some(e) = lock(&saved).error.take() {
        return Err(e);
    }
    let res = res?;
    Ok(DeltaResult {
        out: res.narrow(0, 0, lens.out)?.reshape((b, t, hv, dv))?,
        final_state: res.narrow(0, lens.out, lens.state)?.reshape((sequences, hv, dk, dv))?,
    })
}

/// The lengths of the joined argument's parts (the initial state's 0 when there is none) and of
/// the result's.
#[derive(Debug, Clone)]
struct Lens {
    inputs: [usize; 6],
    out: usize,
    state: usize,
}

impl Lens {
    fn new(d: &DeltaDims, opts: &DeltaOptions, sequences: usize, init: bool) -> Lens {
        let state = d.state_len(sequences);
        let inputs =
            [d.qk_len(), d.qk_len(), d.v_len(), d.g_len(opts.params.gate), d.beta_len(), if init { state } else { 0 }];
        Lens { inputs, out: d.v_len(), state }
    }

    /// The joined argument cut into its parts.
    fn split<'a, T>(&self, flat: &'a [T]) -> [&'a [T]; 6] {
        let mut rest = flat;
        self.inputs.map(|n| {
            let (part, tail) = rest.split_at(n);
            rest = tail;
            part
        })
    }
}

struct DeltaOp {
    d: DeltaDims,
    opts: DeltaOptions,
    lens: Lens,
    saved: Arc<Mutex<ForwardState>>,
}

/// The precision's kernels: the chunked ones in `f32`, the recurrence in `f64`.
trait Kernels: Real + WithDType {
    fn forward(d: &DeltaDims, x: &DeltaInputs<Self>, p: &DeltaParams) -> attn_kernels::Result<DeltaOutput<Self>>;
    fn backward(
        d: &DeltaDims,
        x: &DeltaInputs<Self>,
        p: &DeltaParams,
        dout: &[Self],
        dfinal: Option<&[Self]>,
    ) -> attn_kernels::Result<DeltaGrads<Self>>;
}

impl Kernels for f32 {
    fn forward(d: &DeltaDims, x: &DeltaInputs<f32>, p: &DeltaParams) -> attn_kernels::Result<DeltaOutput<f32>> {
        chunked(d, x, p)
    }
    fn backward(
        d: &DeltaDims,
        x: &DeltaInputs<f32>,
        p: &DeltaParams,
        dout: &[f32],
        dfinal: Option<&[f32]>,
    ) -> attn_kernels::Result<DeltaGrads<f32>> {
        delta_rule_backward(d, x, p, dout, dfinal)
    }
}

impl Kernels for f64 {
    fn forward(d: &DeltaDims, x: &DeltaInputs<f64>, p: &DeltaParams) -> attn_kernels::Result<DeltaOutput<f64>> {
        delta_rule_reference(d, x, p)
    }
    fn backward(
        d: &DeltaDims,
        x: &DeltaInputs<f64>,
        p: &DeltaParams,
        dout: &[f64],
        dfinal: Option<&[f64]>,
    ) -> attn_kernels::Result<DeltaGrads<f64>> {
        delta_rule_reference_backward(d, x, p, dout, dfinal)
    }
}

impl DeltaOp {
    fn inputs<'a, T>(&'a self, flat: &'a [T]) -> DeltaInputs<'a, T> {
        let [q, k, v, g, beta, init] = self.lens.split(flat);
        DeltaInputs {
            q,
            k,
            v,
            g,
            beta,
            initial_state: (self.lens.inputs[5] > 0).then_some(init),
            cu_seqlens: self.opts.cu_seqlens.as_deref(),
        }
    }

    fn fwd<T: Kernels>(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let flat = contiguous::<T>(s, l)?;
        let r = T::forward(&self.d, &self.inputs(flat), &self.opts.params)?;
        let mut joined = r.out;
        joined.extend_from_slice(&r.final_state);
        let n = joined.len();
        Ok((T::to_cpu_storage_owned(joined), Shape::from(n)))
    }

    fn bwd_typed<T: Kernels>(&self, arg: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let (arg, grad) = (arg.contiguous()?, grad.to_dtype(T::DTYPE)?.contiguous()?);
        let (sa, la) = arg.storage_and_layout();
        let (sg, lg) = grad.storage_and_layout();
        let flat = contiguous::<T>(cpu(&sa)?, la)?;
        let grads = contiguous::<T>(cpu(&sg)?, lg)?;
        let (dout, dfinal) = grads.split_at(self.lens.out);
        let x = self.inputs(flat);
        let g = T::backward(&self.d, &x, &self.opts.params, dout, Some(dfinal))?;
        let mut joined = Vec::with_capacity(flat.len());
        for part in [g.dq, g.dk, g.dv, g.dg, g.dbeta] {
            joined.extend_from_slice(&part);
        }
        if x.initial_state.is_some() {
            joined.extend_from_slice(&g.dinitial_state);
        }
        Ok(Tensor::from_vec(joined, flat.len(), arg.device())?)
    }
}

/// The elements of a contiguous 1-D argument.
fn contiguous<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let all = T::cpu_storage_as_slice(s)?;
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => Err(candle_core::Error::Msg("the delta rule's joined argument is not contiguous".into()).into()),
    }
}

impl CustomOp1 for DeltaOp {
    fn name(&self) -> &'static str {
        "attn-delta-rule"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let r = match s {
            CpuStorage::F64(_) => self.fwd::<f64>(s, l),
            _ => self.fwd::<f32>(s, l),
        };
        r.map_err(|e| failed(&self.saved, e))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let r =
            if arg.dtype() == DType::F64 { self.bwd_typed::<f64>(arg, grad) } else { self.bwd_typed::<f32>(arg, grad) };
        r.map(Some).map_err(candle_core::Error::wrap)
    }
}
