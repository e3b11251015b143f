//! Packed tensors `[total, H, D]` (every sequence's rows one after another, no padding), one
//! sequence's rows gathered out of them head-major (the layout the dense kernels read fastest) and
//! results put back, and the validation of the `cu_seqlens` offsets that cut them.

use std::ops::Range;

use half::{bf16, f16};
use rayon::prelude::*;

use super::pool::Held;
use crate::dispatch::KvView;
use crate::error::{AttnError, Result};
use crate::lines::Lines;
use crate::view::View4;

/// A packed tensor `[total, H, D]` over `data`: element `[t, h, d]` is `data[t·s_t + h·s_h + d]`
/// (`D` contiguous). The rows of sequence `s` are `cu_seqlens[s]..cu_seqlens[s + 1]`.
#[derive(Debug, Clone, Copy)]
pub struct Packed<'a, T> {
    data: &'a [T],
    dims: [usize; 3],
    strides: [usize; 2],
}

impl<'a, T> Packed<'a, T> {
    /// A contiguous row-major `[total, H, D]`: `data.len()` must equal the product of `dims`.
    pub fn contiguous(name: &'static str, data: &'a [T], dims: [usize; 3]) -> Result<Self> {
        let [total, h, d] = dims;
        View4::contiguous(name, data, [1, total, h, d])?;
        Ok(Self { data, dims, strides: [h * d, d] })
    }

    /// A strided `[total, H, D]`: element `[t, h, d]` at `data[t·strides[0] + h·strides[1] + d]`;
    /// every reachable element must lie inside `data`.
    pub fn strided(name: &'static str, data: &'a [T], dims: [usize; 3], strides: [usize; 2]) -> Result<Self> {
        let p = Self { data, dims, strides };
        p.view(name, 0..dims[0])?;
        Ok(p)
    }

    /// `[total, H, D]`.
    pub fn dims(&self) -> [usize; 3] {
        self.dims
    }

    /// Rows `rows` (within `0..total`) as the strided `[1, H, len, D]` view (strides
    /// `[_, s_h, s_t]`), for a tensor the kernels read once per row (see [`Packed::gather`]).
    pub(super) fn view(&self, name: &'static str, rows: Range<usize>) -> Result<View4<'a, T>> {
        let [_, h, d] = self.dims;
        let [st, sh] = self.strides;
        let data = self.data.get(rows.start.saturating_mul(st)..).unwrap_or(&[]);
        View4::strided(name, data, [1, h, rows.len(), d], [0, sh, st])
    }

    /// The row `[D]` of token `t`, head `h`.
    fn row(&self, t: usize, h: usize) -> &'a [T] {
        let at = t * self.strides[0] + h * self.strides[1];
        &self.data[at..at + self.dims[2]]
    }
}

impl<T: Copy + Default + Send + Sync> Packed<'_, T> {
    /// Rows `rows` (within `0..total`) copied head-major into `buf` (reused from call to call)
    /// and viewed as the contiguous `[1, H, len, D]` the dense kernels take. For the tensors the
    /// kernels read in place tile after tile (keys and values; in the backward also queries and
    /// output gradients): packed, their row stride is `H·D`, often a power of two, whose rows
    /// crowd into few cache sets, which made the forward slower (see docs/performance-log.md,
    /// "attn-kernels/src/varlen/packed.rs: Packed::gather").
    pub(super) fn gather<'b>(
        &self,
        name: &'static str,
        rows: Range<usize>,
        buf: &'b mut Lines<T>,
    ) -> Result<View4<'b, T>> {
        let [_, h, d] = self.dims;
        let len = rows.len();
        // Every element is written below.
        buf.resize_for_overwrite(h * len * d, T::default());
        if len * d > 0 {
            buf.par_chunks_mut(len * d).enumerate().for_each(|(hi, head)| {
                for (i, dst) in head.chunks_exact_mut(d).enumerate() {
                    dst.copy_from_slice(self.row(rows.start + i, hi));
                }
            });
        }
        View4::contiguous(name, buf, [1, h, len, d])
    }
}

/// Copies a sequence's result `[H, len, D]` (head-major, as the dense kernels write it) into its
/// rows `[len, H, D]` of a contiguous packed tensor.
pub(super) fn scatter_rows(seq: &[f32], rows: &mut [f32], h: usize, d: usize) {
    if h * d == 0 {
        return;
    }
    let len = rows.len() / (h * d);
    rows.par_chunks_exact_mut(h * d).enumerate().for_each(|(i, row)| {
        for (hi, dst) in row.chunks_exact_mut(d).enumerate() {
            dst.copy_from_slice(&seq[(hi * len + i) * d..][..d]);
        }
    });
}

/// A packed key or value tensor `[total_k, Hkv, D]` in one of the storage types of [`KvView`].
#[derive(Debug, Clone, Copy)]
pub enum PackedKv<'a> {
    /// Single precision.
    F32(Packed<'a, f32>),
    /// IEEE half precision.
    F16(Packed<'a, f16>),
    /// bfloat16.
    Bf16(Packed<'a, bf16>),
}

impl<'a> PackedKv<'a> {
    /// `[total_k, Hkv, D]`.
    pub fn dims(&self) -> [usize; 3] {
        match self {
            PackedKv::F32(p) => p.dims(),
            PackedKv::F16(p) => p.dims(),
            PackedKv::Bf16(p) => p.dims(),
        }
    }

    /// Rows `rows` as the strided `[1, Hkv, len, D]` key/value view (see [`Packed::view`]).
    pub(super) fn view(&self, name: &'static str, rows: Range<usize>) -> Result<KvView<'a>> {
        Ok(match self {
            PackedKv::F32(p) => KvView::F32(p.view(name, rows)?),
            PackedKv::F16(p) => KvView::F16(p.view(name, rows)?),
            PackedKv::Bf16(p) => KvView::Bf16(p.view(name, rows)?),
        })
    }

    /// Rows `rows` gathered into `buf` as a contiguous `[1, Hkv, len, D]` key/value view (see
    /// [`Packed::gather`]).
    pub(super) fn gather<'b>(&self, name: &'static str, rows: Range<usize>, buf: &'b mut KvBuf) -> Result<KvView<'b>> {
        Ok(match self {
            PackedKv::F32(p) => KvView::F32(p.gather(name, rows, &mut buf.f32)?),
            PackedKv::F16(p) => KvView::F16(p.gather(name, rows, &mut buf.f16)?),
            PackedKv::Bf16(p) => KvView::Bf16(p.gather(name, rows, &mut buf.bf16)?),
        })
    }
}

/// Reused buffers for one sequence's keys or values, one per storage type.
#[derive(Debug, Default)]
pub(super) struct KvBuf {
    f32: Lines<f32>,
    f16: Lines<f16>,
    bf16: Lines<bf16>,
}

impl Held for KvBuf {
    fn held(&self) -> usize {
        self.f32.held() + self.f16.held() + self.bf16.held()
    }
}

impl<'a> From<Packed<'a, f32>> for PackedKv<'a> {
    fn from(p: Packed<'a, f32>) -> Self {
        PackedKv::F32(p)
    }
}
impl<'a> From<Packed<'a, f16>> for PackedKv<'a> {
    fn from(p: Packed<'a, f16>) -> Self {
        PackedKv::F16(p)
    }
}
impl<'a> From<Packed<'a, bf16>> for PackedKv<'a> {
    fn from(p: Packed<'a, bf16>) -> Self {
        PackedKv::Bf16(p)
    }
}

/// Cumulative sequence lengths, FlashAttention's `cu_seqlens_q` and `cu_seqlens_k`, both `[B + 1]`:
/// sequence `s` holds query rows `q[s]..q[s + 1]` and key rows `k[s]..k[s + 1]`. Each starts at
/// 0, never decreases and ends at its tensor's total rows.
#[derive(Debug, Clone, Copy)]
pub struct CuSeqlens<'a> {
    /// `cu_seqlens_q: [B + 1]`.
    pub q: &'a [usize],
    /// `cu_seqlens_k: [B + 1]`.
    pub k: &'a [usize],
}

impl CuSeqlens<'_> {
    /// The sequences' `(query rows, key rows)`, checked against `total_q` and `total_k`; a bad
    /// offset list is an [`AttnError::Param`] naming `cu_seqlens_q` or `cu_seqlens_k`.
    pub fn sequences(&self, total_q: usize, total_k: usize) -> Result<Vec<(Range<usize>, Range<usize>)>> {
        check_offsets("cu_seqlens_q", self.q, total_q, "q")?;
        check_offsets("cu_seqlens_k", self.k, total_k, "k")?;
        if self.q.len() != self.k.len() {
            return Err(AttnError::Param {
                field: "cu_seqlens_k",
                reason: format!(
                    "{} entries, but cu_seqlens_q has {}: both are [B + 1] for the same B sequences",
                    self.k.len(),
                    self.q.len()
                ),
            });
        }
        let ranges = |cu: &[usize]| cu.windows(2).map(|w| w[0]..w[1]).collect::<Vec<_>>();
        Ok(ranges(self.q).into_iter().zip(ranges(self.k)).collect())
    }
}

/// Checks that `cu` starts at 0, never decreases and ends at `total`, the rows of `tensor`.
fn check_offsets(field: &'static str, cu: &[usize], total: usize, tensor: &str) -> Result<()> {
    let fail = |reason: String| Err(AttnError::Param { field, reason });
    match (cu.first(), cu.last()) {
        (None, _) | (_, None) => fail("empty, expected [B + 1] offsets starting at 0".into()),
        (Some(&first), _) if first != 0 => fail(format!("starts at {first}, expected 0")),
        _ if cu.windows(2).any(|w| w[1] < w[0]) => {
            let at = cu.windows(2).position(|w| w[1] < w[0]).unwrap_or(0) + 1;
            fail(format!(
                "entry {at} is {}, less than entry {} ({}): offsets never decrease",
                cu[at],
                at - 1,
                cu[at - 1]
            ))
        }
        (_, Some(&last)) if last != total => {
            fail(format!("ends at {last}, expected the {total} rows of {tensor} (its first dimension)"))
        }
        _ => Ok(()),
    }
}
