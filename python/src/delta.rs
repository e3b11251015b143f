//! The gated delta rule (`attn_kernels::delta`) on DLPack capsules: the forward and the backward
//! in `float32` (the chunked kernels) or `float64` (the token-by-token oracle). Every tensor is
//! C-contiguous in fla's layouts: `q, k: [B, T, Hk, Dk]`, `v: [B, T, Hv, Dv]`, `beta: [B, T, Hv]`,
//! `g: [B, T, Hv]` (or `[B, T, Hv, Dk]` with `channel`), states `[N, Hv, Dk, Dv]`.

use attn_kernels::delta::{
    delta_rule, delta_rule_backward, delta_rule_reference, delta_rule_reference_backward, DeltaDims, DeltaGrads,
    DeltaInputs, DeltaParams, Gate,
};
use numpy::Element;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, Dtype, Elem};
use crate::{array, run};

/// The inputs of one call, borrowed: `q`, `k`, `v`, `g`, `beta` and the initial state or `None`.
type Tensors<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
);

/// A call's borrowed tensors and sizes.
struct Call<'a> {
    d: DeltaDims,
    p: DeltaParams,
    t: [Borrowed<'a>; 5],
    init: Option<Borrowed<'a>>,
    cu: Option<Vec<usize>>,
    sequences: usize,
}

impl<'a> Call<'a> {
    fn new(
        t: &'a Tensors<'_>,
        cu: Option<Vec<usize>>,
        scale: Option<f64>,
        l2norm: bool,
        channel: bool,
    ) -> PyResult<Call<'a>> {
        let (q, k, v, g, beta, init) = t;
        let t = [
            Borrowed::new("q", q)?,
            Borrowed::new("k", k)?,
            Borrowed::new("v", v)?,
            Borrowed::new("g", g)?,
            Borrowed::new("beta", beta)?,
        ];
        let init = init.as_ref().map(|s| Borrowed::new("initial_state", s)).transpose()?;
        let rank4 = |x: &Borrowed| -> PyResult<[usize; 4]> {
            x.shape
                .as_slice()
                .try_into()
                .map_err(|_| PyValueError::new_err(format!("{}: shape {:?}, expected [B, T, H, D]", x.name, x.shape)))
        };
        let ([b, tt, hk, dk], [_, _, hv, dv]) = (rank4(&t[0])?, rank4(&t[2])?);
        let d = DeltaDims { b, t: tt, hk, hv, dk, dv };
        let p = DeltaParams { scale, l2norm_qk: l2norm, gate: if channel { Gate::Channel } else { Gate::Scalar } };
        let sequences = cu.as_ref().map_or(b, |c| c.len().saturating_sub(1));
        let dtype = t[0].dtype;
        for x in t.iter().chain(&init) {
            if x.dtype != dtype {
                return Err(PyTypeError::new_err(format!(
                    "{}: dtype {}, expected {} as q",
                    x.name,
                    x.dtype.name(),
                    dtype.name()
                )));
            }
        }
        Ok(Call { d, p, t, init, cu, sequences })
    }

    fn inputs<T: Elem>(&self) -> PyResult<DeltaInputs<'_, T>> {
        let [q, k, v, g, beta] = &self.t;
        Ok(DeltaInputs {
            q: q.contiguous()?,
            k: k.contiguous()?,
            v: v.contiguous()?,
            g: g.contiguous()?,
            beta: beta.contiguous()?,
            initial_state: self.init.as_ref().map(|s| s.contiguous()).transpose()?,
            cu_seqlens: self.cu.as_deref(),
        })
    }

    fn state_shape(&self) -> [usize; 4] {
        [self.sequences, self.d.hv, self.d.dk, self.d.dv]
    }

    /// The shapes of `q`, `k`, `v`, `g`, `beta` and the state, for the gradients.
    fn shapes(&self) -> [Vec<usize>; 6] {
        let [q, k, v, g, beta] = &self.t;
        [
            q.shape.clone(),
            k.shape.clone(),
            v.shape.clone(),
            g.shape.clone(),
            beta.shape.clone(),
            self.state_shape().to_vec(),
        ]
    }
}

/// Refuses a dtype the kernels do not run.
fn unsupported(d: Dtype) -> PyErr {
    PyTypeError::new_err(format!("q: dtype {}, expected float32 or float64", d.name()))
}

/// The delta rule's forward: `(out [B, T, Hv, Dv], final_state [N, Hv, Dk, Dv])`.
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, initial_state, cu_seqlens, scale, l2norm, channel))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_forward<'py>(
    py: Python<'py>,
    q: Bound<'py, PyAny>,
    k: Bound<'py, PyAny>,
    v: Bound<'py, PyAny>,
    g: Bound<'py, PyAny>,
    beta: Bound<'py, PyAny>,
    initial_state: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Vec<usize>>,
    scale: Option<f64>,
    l2norm: bool,
    channel: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let tensors = (q, k, v, g, beta, initial_state);
    let c = Call::new(&tensors, cu_seqlens, scale, l2norm, channel)?;
    let out_shape = [c.d.b, c.d.t, c.d.hv, c.d.dv];
    match c.t[0].dtype {
        Dtype::F32 => {
            let x = c.inputs::<f32>()?;
            let r = run(py, || delta_rule(&c.d, &x, &c.p))?;
            Ok((array(py, r.out, &out_shape)?, array(py, r.final_state, &c.state_shape())?))
        }
        Dtype::F64 => {
            let x = c.inputs::<f64>()?;
            let r = run(py, || delta_rule_reference(&c.d, &x, &c.p))?;
            Ok((array(py, r.out, &out_shape)?, array(py, r.final_state, &c.state_shape())?))
        }
        other => Err(unsupported(other)),
    }
}

type Grads<'py> =
    (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

fn grads<'py, T: Element>(py: Python<'py>, g: DeltaGrads<T>, s: &[Vec<usize>; 6]) -> PyResult<Grads<'py>> {
    Ok((
        array(py, g.dq, &s[0])?,
        array(py, g.dk, &s[1])?,
        array(py, g.dv, &s[2])?,
        array(py, g.dg, &s[3])?,
        array(py, g.dbeta, &s[4])?,
        array(py, g.dinitial_state, &s[5])?,
    ))
}

/// The delta rule's backward given `dout [B, T, Hv, Dv]` and the final state's gradient or `None`:
/// `(dq, dk, dv, dg, dbeta, dinitial_state)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, initial_state, cu_seqlens, scale, l2norm, channel, dout, dfinal))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_backward<'py>(
    py: Python<'py>,
    q: Bound<'py, PyAny>,
    k: Bound<'py, PyAny>,
    v: Bound<'py, PyAny>,
    g: Bound<'py, PyAny>,
    beta: Bound<'py, PyAny>,
    initial_state: Option<Bound<'py, PyAny>>,
    cu_seqlens: Option<Vec<usize>>,
    scale: Option<f64>,
    l2norm: bool,
    channel: bool,
    dout: Bound<'py, PyAny>,
    dfinal: Option<Bound<'py, PyAny>>,
) -> PyResult<Grads<'py>> {
    let tensors = (q, k, v, g, beta, initial_state);
    let c = Call::new(&tensors, cu_seqlens, scale, l2norm, channel)?;
    let dout = Borrowed::new("dout", &dout)?;
    let dfinal = dfinal.as_ref().map(|f| Borrowed::new("dfinal_state", f)).transpose()?;
    let shapes = c.shapes();
    match c.t[0].dtype {
        Dtype::F32 => {
            let x = c.inputs::<f32>()?;
            let (o, f) = (dout.contiguous()?, dfinal.as_ref().map(|f| f.contiguous()).transpose()?);
            let r = run(py, || delta_rule_backward(&c.d, &x, &c.p, o, f))?;
            grads(py, r, &shapes)
        }
        Dtype::F64 => {
            let x = c.inputs::<f64>()?;
            let (o, f) = (dout.contiguous()?, dfinal.as_ref().map(|f| f.contiguous()).transpose()?);
            let r = run(py, || delta_rule_reference_backward(&c.d, &x, &c.p, o, f))?;
            grads(py, r, &shapes)
        }
        other => Err(unsupported(other)),
    }
}
