//! Differentiable operations the modules run many times per step, each one candle `CustomOp` whose
//! forward is one pass over memory and whose `bwd` computes the gradients in one pass more, where
//! candle's own compositions allocate a tensor per elementary step (LayerNorm from mean, sub, sqr,
//! div, mul and add; ReLU's backward from zeros, compare, cast and multiply).
//!
//! - [`layer_norm`]: `y = (x − mean) / sqrt(var + eps) · weight + bias` over the last dimension,
//!   with gradients for `x`, `weight` and `bias`;
//! - [`relu`]: `max(x, 0)` with PyTorch's gradient (zero where the output is zero, NaN kept);
//! - [`gelu`]: PyTorch's `gelu`, `x·Φ(x)`, exact or with the tanh approximation, vectorised in
//!   f32, with its gradient;
//! - [`dropout`]: `x · mask` with the mask drawn, in parallel, from a seed's SplitMix64 stream and
//!   kept as bits for the backward, and no gradient made for a constant mask;
//! - [`linear`]: `x·weightᵀ + bias` with the leading dimensions folded into rows, one node where
//!   candle's composition is five, and gradients only for the tracked arguments; [`linear_bf16`]
//!   the same with the weight's products in bfloat16;
//!
//! All run on CPU tensors in `f32` or `f64`, read contiguously (the wrappers make their inputs
//! contiguous first), and split rows over rayon's threads. Other dtypes are computed in `f32`
//! through a cast, which candle's autograd differentiates.

/// `per_float!(storage, "op", |T| body)`: `body` (an expression of type `Result<Vec<T>>`) with
/// `T` the storage's element type, `f32` or `f64`, its result wrapped back into a `CpuStorage`;
/// any other dtype is an error naming the op. The forwards are written once for both.
macro_rules! per_float {
    ($storage:expr, $op:literal, |$t:ident| $body:expr) => {
        match $storage {
            candle_core::CpuStorage::F32(_) => {
                type $t = f32;
                candle_core::CpuStorage::F32($body?)
            }
            candle_core::CpuStorage::F64(_) => {
                type $t = f64;
                candle_core::CpuStorage::F64($body?)
            }
            _ => return Err(candle_core::Error::Msg(concat!($op, ": f32 or f64 input expected").into())),
        }
    };
}

mod dropout;
mod gelu;
mod layer_norm;
mod linear;
mod relu;

pub use dropout::dropout;
pub use gelu::{gelu, Approximate};
pub use layer_norm::layer_norm;
pub use linear::{linear, linear_bf16};
pub use relu::relu;

use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use rayon::prelude::*;

/// Elements per rayon task: enough work to pay for waking a thread (16 rows of a small model's
/// width were not: a training step spent a quarter of its time in thread wake-ups).
const PER_TASK: usize = 1 << 14;

/// Whole rows of `d` elements per rayon task, about [`PER_TASK`] elements.
fn rows_per_task(d: usize) -> usize {
    (PER_TASK / d.max(1)).max(1)
}
/// At most this many row groups carry partial sums over rows in a backward.
const MAX_GROUPS: usize = 64;

/// Elements per row group of `len` elements in rows of `d`: a number of groups fixed by the
/// shape (at most [`MAX_GROUPS`]), so sums over rows do not depend on scheduling.
fn group_len(len: usize, d: usize) -> usize {
    let rows = len.checked_div(d).unwrap_or(0);
    (rows.div_ceil(MAX_GROUPS).max(rows_per_task(d)) * d).max(1)
}

/// The element-wise sum of the groups' partial sums, in group order.
fn add_partials<T: candle_core::WithDType>(partials: Vec<Vec<T>>, width: usize) -> Vec<T> {
    let mut total = vec![T::zero(); width];
    for p in &partials {
        total.iter_mut().zip(p).for_each(|(t, &v)| *t += v);
    }
    total
}

/// `Σ_rows dy` for `dy: [rows·N]`, summed row by row in groups fixed by the shape (see
/// [`group_len`]) and added in order: one pass over the rows, where candle's broadcast gradient is
/// its generic strided sum (a sixth of a training step's time).
fn column_sums<T: candle_core::WithDType>(dy: &[T], n: usize) -> Vec<T> {
    let partials: Vec<Vec<T>> = dy
        .par_chunks(group_len(dy.len(), n))
        .map(|rows| {
            let mut sums = vec![T::zero(); n];
            for r in rows.chunks(n) {
                sums.iter_mut().zip(r).for_each(|(s, &v)| *s += v);
            }
            sums
        })
        .collect();
    add_partials(partials, n)
}

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
