//! `attn._attn`, the native half of the Python package: the kernels' forward and fused backward on
//! NumPy arrays (read in place; results handed to NumPy without a copy), the GIL released while
//! they run. The Python package (`python/attn`) turns PyTorch tensors into these arrays and back.
//!
//! Shapes: `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`; results
//! `out: [B, Hq, Lq, Dv]`, `lse`, `lse_residue: [B, Hq, Lq]`, `weights: [B, Hq, Lq, Lk]`.
//! Types: `float32` queries with `float32`, `float16` or `bfloat16` keys and values run the fast
//! kernel in `f32`; `float64` everything runs the reference kernel in `f64`.

mod options;
mod views;

use attn_kernels::{
    attention, attention_backward, reference, reference_backward, AttnGrads, AttnOutput, Kernel, Saved, View4,
};
use numpy::{Element, IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray4};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::options::Options;
use crate::views::{array4, value_error, view4, Floats};

/// A result buffer as a NumPy array of `shape`, owning the buffer.
fn array<'py, T: Element>(py: Python<'py>, data: Vec<T>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let flat: Bound<'py, PyArray1<T>> = data.into_pyarray(py);
    Ok(flat.reshape(shape)?.into_any())
}

type Forward<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

fn forward_result<'py, T: Element>(
    py: Python<'py>,
    r: AttnOutput<T>,
    q: [usize; 4],
    dv: usize,
) -> PyResult<Forward<'py>> {
    let [b, hq, lq, _] = q;
    Ok((
        array(py, r.out, &[b, hq, lq, dv])?,
        array(py, r.lse, &[b, hq, lq])?,
        array(py, r.lse_residue, &[b, hq, lq])?,
        r.weights
            .map(|w| {
                let lk = w.len() / (b * hq * lq).max(1);
                array(py, w, &[b, hq, lq, lk])
            })
            .transpose()?,
    ))
}

/// Attention forward: `(out, lse, lse_residue, weights or None)`; `kv_dtype` names the storage of
/// `k` and `v` (`float16`/`bfloat16` as `uint16` bits).
#[pyfunction]
#[pyo3(signature = (q, k, v, kv_dtype, opts, want_weights))]
fn forward<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    kv_dtype: &str,
    opts: Options<'py>,
    want_weights: bool,
) -> PyResult<Forward<'py>> {
    let (k, v) = (Floats::extract("k", k, kv_dtype)?, Floats::extract("v", v, kv_dtype)?);
    if let (Floats::F64(k), Floats::F64(v)) = (&k, &v) {
        let q = array4::<f64>("q", q, "float64")?;
        let bias = opts.bias_array::<f64>()?;
        let params = opts.params(bias.as_ref())?;
        let (q, k, v) = (view4("q", &q)?, view4("k", k)?, view4("v", v)?);
        let r = py.detach(|| reference(&q, &k, &v, &params, want_weights)).map_err(value_error)?;
        return forward_result(py, r, q.dims(), v.dims()[3]);
    }
    let q = array4::<f32>("q", q, "float32")?;
    let bias = opts.bias_array::<f32>()?;
    let params = opts.params(bias.as_ref())?;
    let (q, kv, vv) = (view4("q", &q)?, k.kv("k")?, v.kv("v")?);
    let r = py.detach(|| attention(Kernel::Auto, &q, &kv, &vv, &params, want_weights)).map_err(value_error)?;
    forward_result(py, r, q.dims(), vv.dims()[3])
}

type Backward<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

fn backward_result<'py, T: Element>(
    py: Python<'py>,
    g: AttnGrads<T>,
    q: [usize; 4],
    k: [usize; 4],
    dv: usize,
) -> PyResult<Backward<'py>> {
    Ok((
        array(py, g.dq, &q)?,
        array(py, g.dk, &k)?,
        array(py, g.dv, &[k[0], k[1], k[2], dv])?,
        g.dbias
            .map(|d| {
                let n = d.len();
                array(py, d, &[n])
            })
            .transpose()?,
    ))
}

/// A 1-D array's contiguous elements.
fn flat<'a, T: Element>(name: &str, a: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| value_error(format!("{name}: must be contiguous")))
}

/// The arrays a backward reads besides the keys and values, in the compute type `T`: `q`,
/// `out`, `dout` (`[B, H, L, D]`) and the flat `lse`, `lse_residue` (`[B·Hq·Lq]`).
struct BackwardInputs<'py, T: Element> {
    q: PyReadonlyArray4<'py, T>,
    out: PyReadonlyArray4<'py, T>,
    dout: PyReadonlyArray4<'py, T>,
    lse: PyReadonlyArray1<'py, T>,
    lse_residue: PyReadonlyArray1<'py, T>,
}

impl<'py, T: Element + Copy> BackwardInputs<'py, T> {
    fn extract(arrays: [&Bound<'py, PyAny>; 5], dtype: &str) -> PyResult<Self> {
        let [q, out, dout, lse, lse_residue] = arrays;
        let flat = |name: &str, a: &Bound<'py, PyAny>| {
            a.extract::<PyReadonlyArray1<'py, T>>()
                .map_err(|e| PyTypeError::new_err(format!("{name}: expected a 1-D {dtype} array ({e})")))
        };
        Ok(Self {
            q: array4("q", q, dtype)?,
            out: array4("out", out, dtype)?,
            dout: array4("grad_out", dout, dtype)?,
            lse: flat("lse", lse)?,
            lse_residue: flat("lse_residue", lse_residue)?,
        })
    }

    /// The queries and what the kernels' backward reads from its forward.
    fn views(&self) -> PyResult<(View4<'_, T>, Saved<'_, T>)> {
        let saved = Saved {
            out: view4("out", &self.out)?,
            lse: flat("lse", &self.lse)?,
            lse_residue: Some(flat("lse_residue", &self.lse_residue)?),
            forward_path: None,
            dout: view4("grad_out", &self.dout)?,
        };
        Ok((view4("q", &self.q)?, saved))
    }
}

/// Attention backward from the forward's saved `out`, `lse` and `lse_residue` (flattened) and the
/// output's gradient `dout`: `(dq, dk, dv, dbias or None)` with `dq`, `dk`, `dv` in the compute
/// type (`f32`, or `f64` for `float64` inputs) and `dbias` flat, in the bias's own shape's order.
#[pyfunction]
#[pyo3(signature = (q, k, v, kv_dtype, out, dout, lse, lse_residue, opts, want_dbias))]
#[allow(clippy::too_many_arguments)]
fn backward<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    kv_dtype: &str,
    out: &Bound<'py, PyAny>,
    dout: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    lse_residue: &Bound<'py, PyAny>,
    opts: Options<'py>,
    want_dbias: bool,
) -> PyResult<Backward<'py>> {
    let (k, v) = (Floats::extract("k", k, kv_dtype)?, Floats::extract("v", v, kv_dtype)?);
    let arrays = [q, out, dout, lse, lse_residue];
    if let (Floats::F64(k), Floats::F64(v)) = (&k, &v) {
        let inputs = BackwardInputs::<f64>::extract(arrays, "float64")?;
        let bias = opts.bias_array::<f64>()?;
        let params = opts.params(bias.as_ref())?;
        let ((q, s), k, v) = (inputs.views()?, view4("k", k)?, view4("v", v)?);
        let g = py.detach(|| reference_backward(&q, &k, &v, &s, &params, want_dbias)).map_err(value_error)?;
        return backward_result(py, g, q.dims(), k.dims(), v.dims()[3]);
    }
    let inputs = BackwardInputs::<f32>::extract(arrays, "float32")?;
    let bias = opts.bias_array::<f32>()?;
    let params = opts.params(bias.as_ref())?;
    let ((q, s), kv, vv) = (inputs.views()?, k.kv("k")?, v.kv("v")?);
    let g =
        py.detach(|| attention_backward(Kernel::Auto, &q, &kv, &vv, &s, &params, want_dbias)).map_err(value_error)?;
    backward_result(py, g, q.dims(), kv.dims(), vv.dims()[3])
}

/// The native module `attn._attn`.
#[pymodule]
fn _attn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add("ISA", format!("{:?}", attn_kernels::Isa::best()))?;
    Ok(())
}
