//! Typed attention masks with an explicit polarity, so a tutorial's "true = masked" tensor is not
//! silently read as PyTorch's "true = may attend":
//! - [`Mask::keep`]: non-zero = the query may attend to the key (PyTorch SDPA convention);
//! - [`Mask::block`]: non-zero = the key is masked (the convention of many hand-written tutorials).
//!
//! Mask tensors may have any dtype (candle has no `bool`; `U8` is the usual choice; non-zero,
//! NaN included, counts as true) and rank 1 to 4, broadcast right-aligned to `[B, Hq, Lq, Lk]`.
//! Helpers build the common masks: [`Mask::causal`], [`Mask::window`], [`padding_mask`] from token
//! ids (the classic `generate_mask`), and [`key_lengths_from_tokens`] for the cheaper per-batch
//! key-length form. Additive float masks (`0` / `-inf`) are passed as
//! [`SdpaOptions::bias`](crate::SdpaOptions::bias) instead.

use attn_kernels::mask::Band;
use attn_kernels::{Align, Window};
use candle_core::{DType, Device, Tensor};

use crate::error::{AttnLibError, Result};

/// How a mask tensor's non-zero entries are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polarity {
    /// Non-zero = may attend.
    Keep,
    /// Non-zero = masked.
    Block,
}

/// A boolean attention mask: a tensor of rank 1 to 4 broadcastable to `[B, Hq, Lq, Lk]` and the
/// polarity of its entries.
#[derive(Debug, Clone)]
pub struct Mask {
    tensor: Tensor,
    polarity: Polarity,
}

impl Mask {
    /// A mask whose non-zero entries may attend (PyTorch's `attn_mask` of dtype `bool`).
    /// `tensor`: any dtype, broadcastable to `[B, Hq, Lq, Lk]`.
    pub fn keep(tensor: Tensor) -> Self {
        Self { tensor, polarity: Polarity::Keep }
    }

    /// A mask whose non-zero entries are masked out. `tensor`: any dtype, broadcastable to
    /// `[B, Hq, Lq, Lk]`.
    pub fn block(tensor: Tensor) -> Self {
        Self { tensor, polarity: Polarity::Block }
    }

    /// The causal keep-mask `[Lq, Lk]`, top-left aligned: query `i` may attend to key `j` iff
    /// `j <= i` (same as [`SdpaOptions::causal`](crate::SdpaOptions::causal), materialised).
    pub fn causal(lq: usize, lk: usize) -> Result<Self> {
        Self::band(Band::new(true, None, Align::TopLeft, lq, lk), lq, lk)
    }

    /// The sliding-window keep-mask `[Lq, Lk]`: query `i` may attend to key `j` iff
    /// `c - left <= j <= c + right` with `c` the diagonal under `align`; `None` is unbounded
    /// (same as [`SdpaOptions::window`](crate::SdpaOptions::window), materialised).
    pub fn window(lq: usize, lk: usize, left: Option<usize>, right: Option<usize>, align: Align) -> Result<Self> {
        Self::band(Band::new(false, Some(Window { left, right }), align, lq, lk), lq, lk)
    }

    fn band(band: Band, lq: usize, lk: usize) -> Result<Self> {
        let mut data = vec![0u8; lq * lk];
        for (i, row) in data.chunks_mut(lk.max(1)).take(lq).enumerate() {
            let (lo, hi) = band.keys(i, lk);
            row[lo..hi].fill(1);
        }
        Ok(Self::keep(Tensor::from_vec(data, (lq, lk), &Device::Cpu)?))
    }

    /// A key is allowed only where both masks allow it. The result is a keep-mask of the two
    /// shapes broadcast together (right-aligned).
    pub fn and(&self, other: &Mask) -> Result<Mask> {
        let (a, b) = (self.to_keep_tensor()?, other.to_keep_tensor()?);
        Ok(Mask::keep(a.broadcast_mul(&b)?))
    }

    /// A mask of the same polarity over `tensor` (this mask's tensor reshaped or broadcast, say).
    pub fn with_tensor(&self, tensor: Tensor) -> Mask {
        Self { tensor, polarity: self.polarity }
    }

    /// The tensor as given.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// How the tensor's entries are read.
    pub fn polarity(&self) -> Polarity {
        self.polarity
    }

    /// The mask's shape, rank 1 to 4 for a usable mask.
    pub fn shape(&self) -> &[usize] {
        self.tensor.dims()
    }

    /// The mask as a `U8` CPU keep-tensor of the same shape: 1 = may attend, 0 = masked.
    pub fn to_keep_tensor(&self) -> Result<Tensor> {
        let data: Vec<u8> = self.keep_values()?.into_iter().map(u8::from).collect();
        Ok(Tensor::from_vec(data, self.shape(), &Device::Cpu)?)
    }

    /// Row-major keep flags in the mask's own shape (`true` = may attend).
    pub(crate) fn keep_values(&self) -> Result<Vec<bool>> {
        let flat = self.tensor.flatten_all()?;
        let nonzero: Vec<bool> = match flat.dtype() {
            DType::U8 => flat.to_vec1::<u8>()?.into_iter().map(|x| x != 0).collect(),
            _ => flat.to_dtype(DType::F64)?.to_vec1::<f64>()?.into_iter().map(|x| x != 0.0).collect(),
        };
        let keep_when = self.polarity == Polarity::Keep;
        Ok(nonzero.into_iter().map(|nz| nz == keep_when).collect())
    }
}

/// The padding keep-mask `[B, 1, 1, L]` of `token_ids: [B, L]` (integer dtype): a key may be
/// attended to iff its token is not `pad_id`. Broadcasts over heads and queries.
pub fn padding_mask(token_ids: &Tensor, pad_id: u32) -> Result<Mask> {
    let rows = token_rows(token_ids)?;
    let (b, l) = (rows.len(), token_ids.dims()[1]);
    let data: Vec<u8> = rows.iter().flatten().map(|&t| u8::from(t != i64::from(pad_id))).collect();
    Ok(Mask::keep(Tensor::from_vec(data, (b, 1, 1, l), &Device::Cpu)?))
}

/// Per-batch key lengths `[B]` of right-padded `token_ids: [B, L]` (integer dtype): the position
/// of each row's first `pad_id` (or `L`). A row with a real token after a pad (left padding,
/// padding in the middle) is refused: use [`padding_mask`] for those.
pub fn key_lengths_from_tokens(token_ids: &Tensor, pad_id: u32) -> Result<Vec<usize>> {
    let pad = i64::from(pad_id);
    token_rows(token_ids)?
        .iter()
        .enumerate()
        .map(|(b, row)| {
            let len = row.iter().position(|&t| t == pad).unwrap_or(row.len());
            match row[len..].iter().position(|&t| t != pad) {
                None => Ok(len),
                Some(after) => Err(AttnLibError::Value {
                    field: "token_ids",
                    reason: format!(
                        "row {b} is not right-padded (pad at position {len}, token at position {}); \
                         use padding_mask instead",
                        len + after
                    ),
                }),
            }
        })
        .collect()
}

fn token_rows(token_ids: &Tensor) -> Result<Vec<Vec<i64>>> {
    if token_ids.rank() != 2 {
        return Err(AttnLibError::Shape {
            tensor: "token_ids",
            found: token_ids.dims().to_vec(),
            expected: "rank 2, [B, L]".into(),
        });
    }
    match token_ids.dtype() {
        DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64 => {
            Ok(token_ids.to_dtype(DType::I64)?.to_vec2::<i64>()?)
        }
        found => Err(AttnLibError::DType {
            tensor: "token_ids",
            found,
            expected: "an integer dtype (u8, u32, i16, i32, i64)",
        }),
    }
}
