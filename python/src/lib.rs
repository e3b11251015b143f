//! `attn._attn`, the native half of the Python package: the kernels' forward and fused backward on
//! tensors handed over as DLPack capsules (read in place; results handed to NumPy without a copy),
//! run in the package's own thread pool with the GIL released. The Python package
//! (`python/attn`) makes the capsules from NumPy arrays and PyTorch tensors and turns the results
//! back.
//!
//! Shapes: `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`; results
//! `out: [B, Hq, Lq, Dv]`, `lse`, `lse_residue: [B, Hq, Lq]`, `weights: [B, Hq, Lq, Lk]`.
//! Types: `float32` queries with `float32`, `float16` or `bfloat16` keys and values run the fast
//! kernel in `f32` (or with bfloat16 products, `bf16_products`); `float64` everything runs the
//! reference kernel in `f64`. The gated delta rule's forward and backward (`delta`) take fla's
//! layouts; attention against a paged KV cache (`paged`) takes FlashAttention's pages.

mod delta;
mod dlpack;
mod options;
mod paged;
mod pool;
mod views;

use attn_kernels::{
    attention, attention_backward, reference, reference_backward, AttnGrads, AttnOutput, Kernel, Saved, SideGrads,
    WeightsGrad,
};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{Element, IntoPyArray};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, Dtype};
use crate::options::Options;
use crate::views::{kv, value_error, view4};

/// A result buffer as a NumPy array of `shape`, owning the buffer.
fn array<'py, T: Element>(py: Python<'py>, data: Vec<T>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let a = ArrayD::from_shape_vec(IxDyn(shape), data).map_err(value_error)?;
    Ok(a.into_pyarray(py).into_any())
}

create_exception!(
    _attn,
    InternalError,
    PyRuntimeError,
    "A defect of attn's (a panic in the kernels), raised instead of unwinding into Python."
);

/// Runs `f` in the package's pool with the GIL released; its error as `ValueError`, and a panic
/// (a defect: no input should reach one) as `RuntimeError` naming it, never an unwinding across
/// the interpreter (pyo3's `PanicException` is a `BaseException` that `except Exception` misses):
/// [`InternalError`], a `RuntimeError`.
fn run<R: Send, E: std::fmt::Display + Send>(py: Python<'_>, f: impl FnOnce() -> Result<R, E> + Send) -> PyResult<R> {
    let pool = pool::get()?;
    let caught = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.install(f))));
    match caught {
        Ok(r) => r.map_err(value_error),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(InternalError::new_err(format!(
                "attn: internal error ({what}); please report it with the call's shapes"
            )))
        }
    }
}

/// Refuses bfloat16 products for the float64 reference kernel, which computes in float64 only.
fn refuse_bf16_in_f64(opts: &Options<'_>) -> PyResult<()> {
    if opts.bf16_products {
        return Err(PyValueError::new_err(
            "compute: 'bf16' needs float32, float16 or bfloat16 inputs; float64 runs the exact reference kernel",
        ));
    }
    Ok(())
}

type Forward<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

/// The forward's results for queries `q: [B, Hq, Lq, Dk]` and values `v: [B, Hkv, Lk, Dv]`.
fn forward_result<'py, T: Element>(
    py: Python<'py>,
    r: AttnOutput<T>,
    q: [usize; 4],
    v: [usize; 4],
) -> PyResult<Forward<'py>> {
    let ([b, hq, lq, _], [_, _, lk, dv]) = (q, v);
    Ok((
        array(py, r.out, &[b, hq, lq, dv])?,
        array(py, r.lse, &[b, hq, lq])?,
        array(py, r.lse_residue, &[b, hq, lq])?,
        r.weights.map(|w| array(py, w, &[b, hq, lq, lk])).transpose()?,
    ))
}

/// Attention forward on DLPack capsules `q`, `k`, `v`: `(out, lse, lse_residue, weights or None)`.
#[pyfunction]
#[pyo3(signature = (q, k, v, opts, want_weights))]
fn forward<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    opts: Options<'py>,
    want_weights: bool,
) -> PyResult<Forward<'py>> {
    let (q, k, v) = (Borrowed::new("q", q)?, Borrowed::new("k", k)?, Borrowed::new("v", v)?);
    let masks = opts.masks()?;
    if q.dtype == Dtype::F64 {
        refuse_bf16_in_f64(&opts)?;
        let params = opts.params::<f64>(&masks)?;
        let (q, k, v) = (view4(&q)?, view4(&k)?, view4(&v)?);
        let r = run(py, || reference(&q, &k, &v, &params, want_weights))?;
        return forward_result(py, r, q.dims(), v.dims());
    }
    let params = opts.params::<f32>(&masks)?;
    let (q, k, v) = (view4(&q)?, kv(&k)?, kv(&v)?);
    let r = run(py, || attention(Kernel::Auto, &q, &k, &v, &params, want_weights))?;
    forward_result(py, r, q.dims(), v.dims())
}

type Backward<'py> =
    (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, Option<Bound<'py, PyAny>>, Option<Bound<'py, PyAny>>);

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
        g.dsinks.map(|d| array(py, d, &[q[1]])).transpose()?,
    ))
}

/// What a backward reads from its forward, as capsules: `out`, `dout` (`[B, Hq, Lq, Dv]`, the
/// compute type) and the C-contiguous `lse`, `lse_residue` (`[B, Hq, Lq]` or flat); and the
/// gradients that arrived at the log-sum-exp (C-contiguous) and at the weights (with the weights,
/// `[B, Hq, Lq, Lk]`), when any did.
struct SavedCapsules<'a> {
    out: Borrowed<'a>,
    dout: Borrowed<'a>,
    lse: Borrowed<'a>,
    lse_residue: Borrowed<'a>,
    dlse: Option<Borrowed<'a>>,
    dweights: Option<[Borrowed<'a>; 2]>,
}

impl<'a> SavedCapsules<'a> {
    fn saved<T: dlpack::Elem>(&self) -> PyResult<Saved<'a, T>> {
        Ok(Saved {
            out: view4(&self.out)?,
            lse: self.lse.contiguous()?,
            lse_residue: Some(self.lse_residue.contiguous()?),
            forward_path: None,
            dout: view4(&self.dout)?,
            side: SideGrads {
                dlse: self.dlse.as_ref().map(|d| d.contiguous()).transpose()?,
                dweights: match &self.dweights {
                    Some([w, g]) => Some(WeightsGrad { weights: view4(w)?, grad: view4(g)? }),
                    None => None,
                },
            },
        })
    }
}

/// Attention backward from the forward's saved `out`, `lse` and `lse_residue` and the output's
/// gradient `dout` (DLPack capsules), with the gradients `grad_lse` of the log-sum-exp and
/// `grad_weights` of the forward's `weights` when they arrived: `(dq, dk, dv, dbias or None,
/// dsinks or None)` with
/// `dq`, `dk`, `dv` in the compute type (`f32`, or `f64` for `float64` inputs) and `dbias` flat, in
/// the bias's own shape's order.
#[pyfunction]
#[pyo3(signature = (q, k, v, out, dout, lse, lse_residue, opts, want_dbias, grad_lse=None, weights=None, grad_weights=None))]
#[allow(clippy::too_many_arguments)]
fn backward<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    dout: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    lse_residue: &Bound<'py, PyAny>,
    opts: Options<'py>,
    want_dbias: bool,
    grad_lse: Option<&Bound<'py, PyAny>>,
    weights: Option<&Bound<'py, PyAny>>,
    grad_weights: Option<&Bound<'py, PyAny>>,
) -> PyResult<Backward<'py>> {
    let (q, k, v) = (Borrowed::new("q", q)?, Borrowed::new("k", k)?, Borrowed::new("v", v)?);
    let dweights = match (weights, grad_weights) {
        (Some(w), Some(g)) => Some([Borrowed::new("weights", w)?, Borrowed::new("grad_weights", g)?]),
        (None, None) => None,
        _ => return Err(PyValueError::new_err("grad_weights: given without weights, or weights without it")),
    };
    let saved = SavedCapsules {
        out: Borrowed::new("out", out)?,
        dout: Borrowed::new("grad_out", dout)?,
        lse: Borrowed::new("lse", lse)?,
        lse_residue: Borrowed::new("lse_residue", lse_residue)?,
        dlse: grad_lse.map(|g| Borrowed::new("grad_lse", g)).transpose()?,
        dweights,
    };
    let masks = opts.masks()?;
    if q.dtype == Dtype::F64 {
        refuse_bf16_in_f64(&opts)?;
        let params = opts.params::<f64>(&masks)?;
        let (q, k, v, s) = (view4(&q)?, view4(&k)?, view4(&v)?, saved.saved()?);
        let g = run(py, || reference_backward(&q, &k, &v, &s, &params, want_dbias))?;
        return backward_result(py, g, q.dims(), k.dims(), v.dims()[3]);
    }
    let params = opts.params::<f32>(&masks)?;
    let (q, k, v, s) = (view4(&q)?, kv(&k)?, kv(&v)?, saved.saved()?);
    let g = run(py, || attention_backward(Kernel::Auto, &q, &k, &v, &s, &params, want_dbias))?;
    backward_result(py, g, q.dims(), k.dims(), v.dims()[3])
}

/// Panics inside [`run`], as a defect would: checks that the guard turns it into
/// [`InternalError`] (`python/tests/test_patch_contract.py`).
#[pyfunction]
fn panic_for_tests(py: Python<'_>) -> PyResult<()> {
    run(py, || -> Result<(), String> { panic!("a test of the panic guard") })
}

/// The native module `attn._attn`.
#[pymodule]
fn _attn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    m.add_function(wrap_pyfunction!(delta::delta_forward, m)?)?;
    m.add_function(wrap_pyfunction!(delta::delta_backward, m)?)?;
    m.add_function(wrap_pyfunction!(paged::paged_forward, m)?)?;
    m.add_function(wrap_pyfunction!(panic_for_tests, m)?)?;
    m.add_function(wrap_pyfunction!(pool::set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(pool::get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(pool::forget_after_fork, m)?)?;
    m.add("InternalError", m.py().get_type::<InternalError>())?;
    m.add("ISA", format!("{:?}", attn_kernels::Isa::best()))?;
    Ok(())
}
