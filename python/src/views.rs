//! NumPy arrays as the kernels' read-only views, without copying: a 4-D array `[B, H, L, D]`
//! with non-negative strides and a contiguous last dimension becomes a [`View4`] over the span
//! of memory its strides reach; `f16`/`bf16` arrays arrive as `uint16` arrays (NumPy has no
//! `bfloat16`; the Python side views the bits) and are reinterpreted in place.

use attn_kernels::{KvView, View4};
use half::slice::HalfBitsSliceExt;
use half::{bf16, f16};
use numpy::ndarray::ArrayView4;
use numpy::{Element, PyReadonlyArray4, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A `[B, H, L, D]` input in one of the storage types the kernels read.
pub(crate) enum Floats<'py> {
    F32(PyReadonlyArray4<'py, f32>),
    F64(PyReadonlyArray4<'py, f64>),
    /// IEEE half precision, as its bits.
    F16(PyReadonlyArray4<'py, u16>),
    /// bfloat16, as its bits.
    Bf16(PyReadonlyArray4<'py, u16>),
}

impl<'py> Floats<'py> {
    /// Reads `obj`, a 4-D NumPy array holding `dtype` (`"float32"`, `"float64"`, or `"float16"`
    /// / `"bfloat16"` as `uint16` bits).
    pub(crate) fn extract(name: &str, obj: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Self> {
        Ok(match dtype {
            "float32" => Floats::F32(array4(name, obj, dtype)?),
            "float64" => Floats::F64(array4(name, obj, dtype)?),
            "float16" => Floats::F16(array4(name, obj, dtype)?),
            "bfloat16" => Floats::Bf16(array4(name, obj, dtype)?),
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "{name}: dtype {dtype} is not supported (float32, float64, float16, bfloat16)"
                )))
            }
        })
    }

    /// The key/value view of an `f32`, `f16` or `bf16` input.
    pub(crate) fn kv(&self, name: &'static str) -> PyResult<KvView<'_>> {
        Ok(match self {
            Floats::F32(a) => KvView::F32(view4(name, a)?),
            Floats::F16(a) => {
                let bits = view4(name, a)?;
                KvView::F16(
                    View4::strided(name, bits.data().reinterpret_cast::<f16>(), bits.dims(), bits.strides())
                        .map_err(value_error)?,
                )
            }
            Floats::Bf16(a) => {
                let bits = view4(name, a)?;
                KvView::Bf16(
                    View4::strided(name, bits.data().reinterpret_cast::<bf16>(), bits.dims(), bits.strides())
                        .map_err(value_error)?,
                )
            }
            Floats::F64(_) => return Err(PyTypeError::new_err(format!("{name}: float64 keys need float64 queries"))),
        })
    }
}

/// `obj` as a 4-D array of `T` (`dtype` in messages).
pub(crate) fn array4<'py, T: Element>(
    name: &str,
    obj: &Bound<'py, PyAny>,
    dtype: &str,
) -> PyResult<PyReadonlyArray4<'py, T>> {
    obj.extract::<PyReadonlyArray4<'py, T>>()
        .map_err(|e| PyTypeError::new_err(format!("{name}: expected a 4-D {dtype} array ({e})")))
}

/// The kernels' (or a shape) error as Python's `ValueError`, with the library's message.
pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// An `f32` or `f64` array as a view (`name` in messages).
pub(crate) fn view4<'a, T: Element>(name: &'static str, a: &'a PyReadonlyArray4<'_, T>) -> PyResult<View4<'a, T>> {
    let arr: ArrayView4<'a, T> = a.as_array();
    let shape = a.shape();
    let dims = [shape[0], shape[1], shape[2], shape[3]];
    // A dimension of size 1 is never stepped over: its stride, whatever NumPy says, is 0.
    let strides: Vec<isize> = arr.strides().iter().zip(dims).map(|(&s, d)| if d == 1 { 0 } else { s }).collect();
    if let Some(s) = strides.iter().find(|&&s| s < 0) {
        return Err(PyValueError::new_err(format!(
            "{name}: negative stride {s} in {strides:?}; pass a copy (numpy.ascontiguousarray)"
        )));
    }
    if dims[3] > 1 && strides[3] != 1 {
        return Err(PyValueError::new_err(format!(
            "{name}: the last dimension is strided (stride {} elements); it must be contiguous",
            strides[3]
        )));
    }
    let strides: [usize; 4] = [strides[0] as usize, strides[1] as usize, strides[2] as usize, strides[3] as usize];
    let data: &'a [T] = if dims.contains(&0) {
        &[]
    } else {
        let reach = (0..4).try_fold(1usize, |acc, i| (dims[i] - 1).checked_mul(strides[i])?.checked_add(acc));
        let len = reach.ok_or_else(|| PyValueError::new_err(format!("{name}: strides overflow")))?;
        // SAFETY: NumPy guarantees that every element `Σ idx_i·stride_i` of the array lies in one
        // live, initialised allocation (the array's base buffer), and the strides are
        // non-negative, so the span from the first element to the last reachable one (`len`
        // elements) lies inside it, aligned for `T`. The borrow `a` is a read-only borrow checked
        // by rust-numpy, held for `'a`, which keeps the array alive and unwritten by Rust code.
        unsafe { std::slice::from_raw_parts(arr.as_ptr(), len) }
    };
    View4::strided(name, data, dims, [strides[0], strides[1], strides[2]]).map_err(value_error)
}
