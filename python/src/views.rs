//! Borrowed DLPack tensors ([`Borrowed`]) as the kernels' read-only views, without copying: a 4-D
//! tensor `[B, H, L, D]` with non-negative strides and a contiguous last dimension becomes a
//! [`View4`] over the span of memory its strides reach; keys and values of `float32`, `float16`
//! or `bfloat16` become a [`KvView`]; a C-contiguous mask of rank 1 to 4 a [`Broadcast`].

use attn_kernels::{Broadcast, KvView, View4};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, Dtype, Elem};

/// A 4-D tensor of `T` as a view.
pub(crate) fn view4<'a, T: Elem>(t: &Borrowed<'a>) -> PyResult<View4<'a, T>> {
    let name = t.name;
    let &[b, h, l, d] = t.shape.as_slice() else {
        return Err(PyValueError::new_err(format!("{name}: rank {} (shape {:?}), expected 4", t.shape.len(), t.shape)));
    };
    let dims = [b, h, l, d];
    let strides = t.strides();
    if let Some(s) = strides.iter().find(|&&s| s < 0) {
        return Err(PyValueError::new_err(format!(
            "{name}: negative stride {s} in {strides:?}; pass a copy (.contiguous(), numpy.ascontiguousarray)"
        )));
    }
    // An empty tensor has no layout to check (PyTorch gives them any strides, zeros included).
    let empty = dims.contains(&0);
    if d > 1 && strides[3] != 1 && !empty {
        return Err(PyValueError::new_err(format!(
            "{name}: the last dimension is strided (stride {} elements); it must be contiguous",
            strides[3]
        )));
    }
    let s = if empty {
        [0; 4]
    } else {
        [strides[0] as usize, strides[1] as usize, strides[2] as usize, strides[3] as usize]
    };
    let reach = if empty {
        Some(0)
    } else {
        (0..4).try_fold(1usize, |acc, i| (dims[i] - 1).checked_mul(s[i])?.checked_add(acc))
    };
    let reach = reach.ok_or_else(|| PyValueError::new_err(format!("{name}: strides overflow")))?;
    View4::strided(name, t.span(reach)?, dims, [s[0], s[1], s[2]]).map_err(value_error)
}

/// Keys or values in `float32`, `float16` or `bfloat16`.
pub(crate) fn kv<'a>(t: &Borrowed<'a>) -> PyResult<KvView<'a>> {
    Ok(match t.dtype {
        Dtype::F32 => KvView::F32(view4(t)?),
        Dtype::F16 => KvView::F16(view4(t)?),
        Dtype::Bf16 => KvView::Bf16(view4(t)?),
        other => {
            return Err(PyTypeError::new_err(format!(
                "{}: dtype {}, expected float32, float16 or bfloat16 (float64 needs float64 queries)",
                t.name,
                other.name()
            )))
        }
    })
}

/// A C-contiguous mask or bias of rank 1 to 4, broadcast right-aligned to `[B, Hq, Lq, Lk]`.
pub(crate) fn broadcast<'a, T: Elem>(t: &Borrowed<'a>) -> PyResult<Broadcast<'a, T>> {
    Broadcast::new(t.name, t.contiguous()?, &t.shape).map_err(value_error)
}

/// The kernels' (or a shape) error as Python's `ValueError`, with the library's message.
pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}
