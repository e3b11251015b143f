//! Packed batches: `B` sequences of different lengths stored one after another with no padding,
//! FlashAttention's varlen layout. A [`Packed`] holds the rows `[total, ..]` (token ids `[total]`,
//! activations `[total, E]`) and the offsets `cu_seqlens` `[B + 1]` (`0, l_0, l_0 + l_1, …,
//! total`); sequence `s` is rows `cu_seqlens[s]..cu_seqlens[s + 1]`. The modules' `forward_packed`
//! methods take and return packed batches: attention stays within each sequence, positions (RoPE,
//! sinusoidal) restart at 0 for each, and no work or memory is spent on padding.
//!
//! Build one from a list of sequences ([`Packed::from_sequences`]) or from a padded batch and its
//! lengths ([`Packed::from_padded`]); [`Packed::to_padded`] goes back. Both conversions are
//! differentiable (row gathers), so a loss on either side reaches the other.

use candle_core::{DType, Tensor};

use crate::error::{NnError, Result};

const MODULE: &str = "Packed";

/// Sequences packed one after another.
///
/// ```
/// use attn_nn::Packed;
/// # fn main() -> attn_nn::Result<()> {
/// let x = attn::random::uniform(&[2, 4, 8], -1.0, 1.0, 1)?; // [B, L, E], padded
/// let packed = Packed::from_padded(&x, &[4, 2])?; // the first 4 rows of sequence 0, 2 of sequence 1
/// assert_eq!((packed.data().dims(), packed.cu_seqlens()), (&[6, 8][..], &[0, 4, 6][..]));
/// assert_eq!(packed.positions(), [0, 1, 2, 3, 0, 1]);
/// assert_eq!(packed.to_padded(4)?.dims(), [2, 4, 8]); // zeros beyond each length
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Packed {
    /// `[total, ..]`.
    data: Tensor,
    /// `[B + 1]`, from 0 to `total`, never decreasing.
    cu_seqlens: Vec<usize>,
}

impl Packed {
    /// `data: [total, ..]` cut by `cu_seqlens` (`[B + 1]`: 0 first, never decreasing, `total`
    /// last; see [`attn::cu_seqlens`]).
    pub fn new(data: Tensor, cu_seqlens: Vec<usize>) -> Result<Self> {
        let total = data.dims().first().copied();
        let ok = cu_seqlens.len() >= 2
            && cu_seqlens[0] == 0
            && cu_seqlens.windows(2).all(|w| w[0] <= w[1])
            && total == cu_seqlens.last().copied();
        if !ok {
            return Err(NnError::Input {
                module: MODULE,
                input: "cu_seqlens",
                found: cu_seqlens,
                expected: format!("B + 1 >= 2 offsets from 0 to the rows of data {:?}, never decreasing", data.dims()),
            });
        }
        Ok(Self { data, cu_seqlens })
    }

    /// The sequences `seqs[s]: [l_s, ..]` (same trailing shape and dtype) packed in order.
    pub fn from_sequences(seqs: &[Tensor]) -> Result<Self> {
        let lengths = seqs.iter().map(|s| s.dims().first().copied().unwrap_or(0)).collect::<Vec<_>>();
        if seqs.is_empty() || seqs.iter().any(|s| s.rank() == 0) {
            return Err(NnError::Input {
                module: MODULE,
                input: "sequences",
                found: lengths,
                expected: "at least one sequence, each of rank >= 1".into(),
            });
        }
        Self::new(Tensor::cat(seqs, 0)?, attn::cu_seqlens(&lengths))
    }

    /// The first `lengths[b]` rows of each `x[b]`, `x: [B, L, ..]` (right padding dropped).
    pub fn from_padded(x: &Tensor, lengths: &[usize]) -> Result<Self> {
        let dims = x.dims();
        let (b, l) = match dims {
            [b, l, ..] => (*b, *l),
            _ => (0, 0),
        };
        if dims.len() < 2 || b != lengths.len() || lengths.iter().any(|&n| n > l) {
            return Err(NnError::Input {
                module: MODULE,
                input: "x",
                found: dims.to_vec(),
                expected: format!("[B, L, ..] with B = {} lengths {lengths:?}, each at most L", lengths.len()),
            });
        }
        let rows: Vec<u32> =
            lengths.iter().enumerate().flat_map(|(s, &n)| (0..n).map(move |j| (s * l + j) as u32)).collect();
        let flat = x.reshape([&[b * l], &dims[2..]].concat())?;
        let index = Tensor::from_vec(rows, lengths.iter().sum::<usize>(), x.device())?;
        Self::new(flat.index_select(&index, 0)?, attn::cu_seqlens(lengths))
    }

    /// The padded batch `[B, len, ..]`: sequence `s` in the first `l_s` rows of entry `s`, zeros
    /// after; `len` must be at least the longest sequence.
    pub fn to_padded(&self, len: usize) -> Result<Tensor> {
        let lengths = self.lengths();
        if lengths.iter().any(|&n| n > len) {
            return Err(NnError::Input {
                module: MODULE,
                input: "len",
                found: vec![len],
                expected: format!("at least the longest of the lengths {lengths:?}"),
            });
        }
        let (total, tail) = (self.total(), &self.data.dims()[1..]);
        let zero = Tensor::zeros([&[1], tail].concat(), self.data.dtype(), self.data.device())?;
        let rows = Tensor::cat(&[&self.data, &zero], 0)?; // row `total` is the zero row
        let index: Vec<u32> = self
            .cu_seqlens
            .windows(2)
            .flat_map(|w| (0..len).map(move |j| if w[0] + j < w[1] { (w[0] + j) as u32 } else { total as u32 }))
            .collect();
        let index = Tensor::from_vec(index, self.batch() * len, self.data.device())?;
        Ok(rows.index_select(&index, 0)?.reshape([&[self.batch(), len], tail].concat())?)
    }

    /// The rows `[total, ..]`.
    pub fn data(&self) -> &Tensor {
        &self.data
    }

    /// The offsets `[B + 1]`.
    pub fn cu_seqlens(&self) -> &[usize] {
        &self.cu_seqlens
    }

    /// How many sequences (`B`).
    pub fn batch(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    /// How many rows (`total`).
    pub fn total(&self) -> usize {
        self.cu_seqlens[self.batch()]
    }

    /// Each sequence's length `[B]`.
    pub fn lengths(&self) -> Vec<usize> {
        self.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Each row's position within its sequence `[total]`: `0..l_0, 0..l_1, …`.
    pub fn positions(&self) -> Vec<usize> {
        self.cu_seqlens.windows(2).flat_map(|w| 0..w[1] - w[0]).collect()
    }

    /// The same sequences with new rows `data: [total, ..]` (a module's output).
    pub fn with_data(&self, data: Tensor) -> Result<Self> {
        Self::new(data, self.cu_seqlens.clone())
    }

    /// Checks that the rows are `[total, width]` of `dtype`, naming `module` and `input`.
    pub(crate) fn expect_rows(
        &self,
        module: &'static str,
        input: &'static str,
        width: usize,
        dtype: DType,
    ) -> Result<()> {
        match *self.data.dims() {
            [_, w] if w == width => crate::error::expect_dtype(module, input, &self.data, dtype),
            _ => Err(NnError::Input {
                module,
                input,
                found: self.data.dims().to_vec(),
                expected: format!("packed rows [total, {width}]"),
            }),
        }
    }
}
