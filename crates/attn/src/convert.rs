//! Bridges candle tensors and the kernels' slice views: device and dtype checks, zero-copy strided
//! views into a tensor's CPU storage, float values read to host memory, and flat kernel results
//! back into tensors.
//!
//! Queries are always read as `f32`; keys and values are read in place when stored as `f32`,
//! `f16` or `bf16` (the kernels accumulate in `f32`), and converted to `f32` when `f64`. A tensor
//! whose last dimension is strided is made contiguous; other strides are used as they are.

use attn_kernels::{KvView, Packed, PackedKv, View4};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Tensor, WithDType};

use crate::error::{AttnLibError, Result};

/// Refuses a tensor that is not on the CPU or not of a float dtype.
pub(crate) fn check_input(name: &'static str, t: &Tensor) -> Result<()> {
    if !t.device().is_cpu() {
        return Err(AttnLibError::Device { tensor: name, found: format!("{:?}", t.device().location()) });
    }
    check_float(name, t)
}

/// Refuses a tensor whose dtype is not `f16`, `bf16`, `f32` or `f64`.
fn check_float(name: &'static str, t: &Tensor) -> Result<()> {
    match t.dtype() {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Ok(()),
        found => Err(AttnLibError::DType { tensor: name, found, expected: "a float dtype (f16, bf16, f32, f64)" }),
    }
}

/// `t` as `f32` with a contiguous last dimension.
pub(crate) fn as_query(t: &Tensor) -> Result<Tensor> {
    let t = if t.dtype() == DType::F32 { t.clone() } else { t.to_dtype(DType::F32)? };
    last_dim_contiguous(t)
}

/// `t` as `f32`, `f16` or `bf16` with a contiguous last dimension.
pub(crate) fn as_key_value(t: &Tensor) -> Result<Tensor> {
    let t = if t.dtype() == DType::F64 { t.to_dtype(DType::F32)? } else { t.clone() };
    last_dim_contiguous(t)
}

fn last_dim_contiguous(t: Tensor) -> Result<Tensor> {
    let last_ok = t.dims().last().is_none_or(|&d| d <= 1) || t.stride().last() == Some(&1);
    Ok(if last_ok { t } else { t.contiguous()? })
}

/// A `[B, H, L, D]` view of rank-4 CPU storage of element type `T`; refuses a layout whose last
/// dimension is not contiguous (the views read it as if it were).
pub(crate) fn view4<'a, T: WithDType>(
    name: &'static str,
    cpu: &'a CpuStorage,
    layout: &Layout,
) -> Result<View4<'a, T>> {
    let (data, dims) = storage(name, cpu, layout, "rank 4")?;
    let s = layout.stride();
    if dims[3] > 1 && s[3] != 1 {
        let reason = format!("last dimension has stride {}, expected 1", s[3]);
        return Err(attn_kernels::AttnError::Layout { tensor: name, reason }.into());
    }
    Ok(View4::strided(name, data, dims, [s[0], s[1], s[2]])?)
}

/// The elements of `T` of CPU storage from `layout`'s start on, and its dimensions, which must
/// number `N` (`rank` names them in the error).
fn storage<'a, T: WithDType, const N: usize>(
    name: &'static str,
    cpu: &'a CpuStorage,
    layout: &Layout,
    rank: &str,
) -> Result<(&'a [T], [usize; N])> {
    let data = cpu.as_slice::<T>()?;
    let data = data.get(layout.start_offset()..).unwrap_or(&[]);
    let dims = layout.dims().try_into().map_err(|_| AttnLibError::Shape {
        tensor: name,
        found: layout.dims().to_vec(),
        expected: rank.into(),
    })?;
    Ok((data, dims))
}

/// A key/value view of the CPU storage of a tensor prepared by [`as_key_value`].
pub(crate) fn kv_view<'a>(name: &'static str, cpu: &'a CpuStorage, layout: &Layout) -> Result<KvView<'a>> {
    match cpu.dtype() {
        DType::F32 => Ok(KvView::F32(view4(name, cpu, layout)?)),
        DType::F16 => Ok(KvView::F16(view4(name, cpu, layout)?)),
        DType::BF16 => Ok(KvView::Bf16(view4(name, cpu, layout)?)),
        found => Err(AttnLibError::DType { tensor: name, found, expected: "f32, f16 or bf16" }),
    }
}

/// A packed `[total, H, D]` view of rank-3 CPU storage of element type `T` whose last dimension
/// is contiguous.
pub(crate) fn packed<'a, T: WithDType>(
    name: &'static str,
    cpu: &'a CpuStorage,
    layout: &Layout,
) -> Result<Packed<'a, T>> {
    let (data, dims) = storage(name, cpu, layout, "rank 3 [total, H, D]")?;
    let s = layout.stride();
    Ok(Packed::strided(name, data, dims, [s[0], s[1]])?)
}

/// A packed key/value view of the CPU storage of a rank-3 tensor prepared by [`as_key_value`].
pub(crate) fn packed_kv<'a>(name: &'static str, cpu: &'a CpuStorage, layout: &Layout) -> Result<PackedKv<'a>> {
    match cpu.dtype() {
        DType::F32 => Ok(PackedKv::F32(packed(name, cpu, layout)?)),
        DType::F16 => Ok(PackedKv::F16(packed(name, cpu, layout)?)),
        DType::BF16 => Ok(PackedKv::Bf16(packed(name, cpu, layout)?)),
        found => Err(AttnLibError::DType { tensor: name, found, expected: "f32, f16 or bf16" }),
    }
}

/// `t` as a contiguous f32 tensor.
pub(crate) fn contiguous_f32(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.contiguous()?)
}

/// The row-major values of a float tensor (any device) as `T`; refuses other dtypes.
pub(crate) fn float_values<T: WithDType>(name: &'static str, t: &Tensor) -> Result<Vec<T>> {
    check_float(name, t)?;
    Ok(t.flatten_all()?.to_dtype(T::DTYPE)?.to_vec1::<T>()?)
}
