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
use crate::views::{value_error, view4, Floats};

/// A result buffer as a NumPy array of `shape`, owning the buffer.
fn array<'py, T: Element>(py: Python<'py>, data: Vec<T>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let flat: Bound<'py, PyArray1<T>> = data.into_pyarray(py);
    Ok(flat.reshape(shape)?.into_any())
}

type Forward<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

fn forward_result<'py, T: Element>(py: Python<'py>, r: AttnOutput<T>, q: [usize; 4], dv: usize) -> PyResult<Forward<'py>> {
    let [b, hq, lq, _] = q;
    Ok((
        array(py, r.out, &[b, hq, lq, dv])?,
        array(py, r.lse, &[b, hq, lq])?,
        array(py, r.lse_residue, &[b, hq, lq])?,
        r.weights.map(|w| {
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
        let q: PyReadonlyArray4<f64> = q.extract().map_err(|_| PyTypeError::new_err("q: float64 keys need float64 queries"))?;
        let bias = opts.bias_array::<f64>()?;
        let params = opts.params(bias.as_ref())?;
        let (q, k, v) = (view4("q", &q)?, view4("k", k)?, view4("v", v)?);
        let r = py.detach(|| reference(&q, &k, &v, &params, want_weights)).map_err(value_error)?;
        return forward_result(py, r, q.dims(), v.dims()[3]);
    }
    let q: PyReadonlyArray4<f32> = q.extract().map_err(|_| PyTypeError::new_err("q: expected a 4-D float32 array"))?;
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
        g.dbias.map(|d| {
            let n = d.len();
            array(py, d, &[n])
        })
        .transpose()?,
    ))
}

/// The forward's saved results as the kernels read them.
fn saved<'a, T: Element + Copy>(
    out: &'a PyReadonlyArray4<'_, T>,
    dout: &'a PyReadonlyArray4<'_, T>,
    lse: &'a PyReadonlyArray1<'_, T>,
    lse_residue: &'a PyReadonlyArray1<'_, T>,
) -> PyResult<Saved<'a, T>> {
    let flat = |name: &str, a: &'a PyReadonlyArray1<'_, T>| {
        a.as_slice().map_err(|_| value_error(format!("{name}: must be contiguous")))
    };
    Ok(Saved {
        out: view4("out", out)?,
        lse: flat("lse", lse)?,
        lse_residue: Some(flat("lse_residue", lse_residue)?),
        forward_path: None,
        dout: view4("grad_out", dout)?,
    })
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
    let wrong = |name: &str, t: &str| PyTypeError::new_err(format!("{name}: expected a {t} array"));
    if let (Floats::F64(k), Floats::F64(v)) = (&k, &v) {
        let arr4 = |name, a: &Bound<'py, PyAny>| a.extract::<PyReadonlyArray4<f64>>().map_err(|_| wrong(name, "4-D float64"));
        let arr1 = |name, a: &Bound<'py, PyAny>| a.extract::<PyReadonlyArray1<f64>>().map_err(|_| wrong(name, "1-D float64"));
        let (q, out, dout) = (arr4("q", q)?, arr4("out", out)?, arr4("grad_out", dout)?);
        let (lse, res) = (arr1("lse", lse)?, arr1("lse_residue", lse_residue)?);
        let bias = opts.bias_array::<f64>()?;
        let params = opts.params(bias.as_ref())?;
        let (q, k, v): (View4<f64>, _, _) = (view4("q", &q)?, view4("k", k)?, view4("v", v)?);
        let s = saved(&out, &dout, &lse, &res)?;
        let g = py.detach(|| reference_backward(&q, &k, &v, &s, &params, want_dbias)).map_err(value_error)?;
        return backward_result(py, g, q.dims(), k.dims(), v.dims()[3]);
    }
    let arr4 = |name, a: &Bound<'py, PyAny>| a.extract::<PyReadonlyArray4<f32>>().map_err(|_| wrong(name, "4-D float32"));
    let arr1 = |name, a: &Bound<'py, PyAny>| a.extract::<PyReadonlyArray1<f32>>().map_err(|_| wrong(name, "1-D float32"));
    let (q, out, dout) = (arr4("q", q)?, arr4("out", out)?, arr4("grad_out", dout)?);
    let (lse, res) = (arr1("lse", lse)?, arr1("lse_residue", lse_residue)?);
    let bias = opts.bias_array::<f32>()?;
    let params = opts.params(bias.as_ref())?;
    let (q, kv, vv) = (view4("q", &q)?, k.kv("k")?, v.kv("v")?);
    let s = saved(&out, &dout, &lse, &res)?;
    let g = py
        .detach(|| attention_backward(Kernel::Auto, &q, &kv, &vv, &s, &params, want_dbias))
        .map_err(value_error)?;
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
