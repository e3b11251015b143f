//! Attention against a paged KV cache (`attn_kernels::paged`) on DLPack capsules, for
//! `flash_attn_with_kvcache`'s `block_table` path: `q: [B, Hq, Lq, D]` float32 with a contiguous
//! last dimension (FlashAttention's `[B, Lq, Hq, D]` transposed, read in place), pages `[num_pages,
//! page_size, Hkv, D]` C-contiguous in float32, float16 or bfloat16, the block table `[B,
//! max_pages]` flattened and the lengths `[B]` (the new keys included).

use attn_kernels::paged::{paged_attention, PagedKv, PagedParams, Pages};
use attn_kernels::Window;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, Dtype};
use crate::views::view4;
use crate::{array, run};

/// A C-contiguous page tensor `[num_pages, page_size, Hkv, D]` as the kernel's storage and its
/// sizes `(page_size, Hkv, D)`.
fn pages<'a>(t: &Borrowed<'a>) -> PyResult<(Pages<'a>, [usize; 3])> {
    let &[_, page_size, heads, d] = t.shape.as_slice() else {
        return Err(PyValueError::new_err(format!(
            "{}: shape {:?}, expected [num_pages, page_size, Hkv, D]",
            t.name, t.shape
        )));
    };
    let p = match t.dtype {
        Dtype::F32 => Pages::F32(t.contiguous()?),
        Dtype::F16 => Pages::F16(t.contiguous()?),
        Dtype::Bf16 => Pages::Bf16(t.contiguous()?),
        other => {
            return Err(PyTypeError::new_err(format!(
                "{}: dtype {}, expected float32, float16 or bfloat16",
                t.name,
                other.name()
            )))
        }
    };
    Ok((p, [page_size, heads, d]))
}

/// `(out [B, Hq, Lq, Dv], lse [B, Hq, Lq])` of the queries against the pages, causal and the
/// window `(left, right)` (`None` = unbounded) aligned bottom-right per sequence.
#[pyfunction]
#[pyo3(signature = (q, k_pages, v_pages, block_table, seqlens, scale, causal, window, softcap))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_forward<'py>(
    py: Python<'py>,
    q: Bound<'py, PyAny>,
    k_pages: Bound<'py, PyAny>,
    v_pages: Bound<'py, PyAny>,
    block_table: Vec<i32>,
    seqlens: Vec<i32>,
    scale: Option<f64>,
    causal: bool,
    window: Option<(Option<usize>, Option<usize>)>,
    softcap: Option<f64>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let (qb, kb, vb) =
        (Borrowed::new("q", &q)?, Borrowed::new("k_cache", &k_pages)?, Borrowed::new("v_cache", &v_pages)?);
    if qb.dtype != Dtype::F32 {
        return Err(PyTypeError::new_err(format!("q: dtype {}, expected float32", qb.dtype.name())));
    }
    let qv = view4::<f32>(&qb)?;
    let ((k, [page_size, heads, dk]), (v, [vps, vheads, dv])) = (pages(&kb)?, pages(&vb)?);
    if (vps, vheads) != (page_size, heads) || kb.shape[0] != vb.shape[0] {
        return Err(PyValueError::new_err(format!(
            "v_cache: shape {:?}, expected the pages, page size and heads of k_cache {:?}",
            vb.shape, kb.shape
        )));
    }
    let cache = PagedKv { k, v, page_size, heads, dk, dv, block_table: &block_table, seqlens: &seqlens };
    let p =
        PagedParams { scale, causal, window: window.map(|(left, right)| Window { left, right }), softcap, sinks: None };
    let [b, hq, lq, _] = qv.dims();
    let (o, l) = run(py, || {
        let mut out = vec![0.0f32; b * hq * lq * dv];
        let mut lse = vec![0.0f32; b * hq * lq];
        paged_attention(&qv, &cache, &p, &mut out, &mut lse).map(|()| (out, lse))
    })?;
    Ok((array(py, o, &[b, hq, lq, dv])?, array(py, l, &[b, hq, lq])?))
}
