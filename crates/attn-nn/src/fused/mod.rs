//! Differentiable operations the modules run many times per step, each one candle `CustomOp` whose
//! forward is one pass over memory and whose `bwd` computes the gradients in one pass more, where
//! candle's own compositions allocate a tensor per elementary step (LayerNorm from mean, sub, sqr,
//! div, mul and add; ReLU's backward from zeros, compare, cast and multiply).
//!
//! - [`layer_norm`]: `y = (x − mean) / sqrt(var + eps) · weight + bias` over the last dimension,
//!   with gradients for `x`, `weight` and `bias`;
//! - [`relu`]: `max(x, 0)` with PyTorch's gradient (zero where the output is zero, NaN kept).
//!
//! Both run on CPU tensors in `f32` or `f64`, read contiguously (the wrappers make their inputs
//! contiguous first), and split rows over rayon's threads. Other dtypes are computed in `f32`
//! through a cast, which candle's autograd differentiates.

mod layer_norm;
mod relu;

pub use layer_norm::layer_norm;
pub use relu::relu;

use candle_core::{CpuStorage, DType, Layout, Result, Tensor};

/// Rows per rayon task: enough work to pay for a task, small enough to spread `[B·L, D]` rows.
const ROWS_PER_TASK: usize = 16;

/// The contiguous values of `storage` under `layout`, as `T`.
fn contiguous<'a, T: candle_core::WithDType>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&storage.as_slice::<T>()?[start..end]),
        None => Err(candle_core::Error::RequiresContiguous { op: "fused" }),
    }
}

/// `t` in a dtype the fused ops compute in (`f32` or `f64`) and contiguous.
fn prepared(t: &Tensor) -> Result<Tensor> {
    let t = match t.dtype() {
        DType::F32 | DType::F64 => t.clone(),
        _ => t.to_dtype(DType::F32)?,
    };
    t.contiguous()
}

/// Calls `f` on the contiguous CPU values of `t` as `T`, without copying them.
fn with_values<T: candle_core::WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(cpu) => f(contiguous(cpu, layout)?),
        _ => Err(candle_core::Error::Msg("fused ops run on CPU tensors".into())),
    }
}
