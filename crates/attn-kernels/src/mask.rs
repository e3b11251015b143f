//! Mask semantics shared by every kernel: causal and sliding-window bands with their alignment,
//! per-batch key lengths (these three reduce to one contiguous key range per query row), and the
//! element-wise boolean mask and additive bias read through broadcast strides, and the block-sparse
//! [`BlockMask`] (see [`crate::sparse`]).
//!
//! Conventions (PyTorch `scaled_dot_product_attention` unless chosen otherwise):
//! - `keep = true` means the query may attend to the key;
//! - causal, top-left aligned: key `j` allowed iff `j <= i`; bottom-right (FlashAttention):
//!   `j <= i + Lk - Lq`;
//! - window `(left, right)`: key `j` allowed iff `c - left <= j <= c + right` with `c` the aligned
//!   diagonal, each side unbounded when `None`;
//! - a key at or beyond its batch's key length is masked;
//! - a bias equal to −∞ masks its key exactly like a `false` in the boolean mask.

use crate::sparse::BlockMask;
use crate::view::{Broadcast, Resolved};

/// Where the causal diagonal (and a window's centre) sits when `Lq != Lk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Align {
    /// Query `i` is aligned with key `i` (PyTorch `is_causal`).
    #[default]
    TopLeft,
    /// The last query is aligned with the last key (FlashAttention, KV-cache decoding).
    BottomRight,
}

/// A sliding window around the aligned diagonal; `None` on a side means unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Keys allowed before the diagonal.
    pub left: Option<usize>,
    /// Keys allowed after the diagonal.
    pub right: Option<usize>,
}

/// Every mask an attention call can carry; all compose (a key is allowed only if every part
/// allows it).
#[derive(Debug, Clone, Copy, Default)]
pub struct MaskSpec<'a, T> {
    /// Causal masking.
    pub causal: bool,
    /// Sliding window.
    pub window: Option<Window>,
    /// Alignment of the causal diagonal and the window centre.
    pub align: Align,
    /// Valid key count per batch, `[B]`; keys at positions `>= key_lengths[b]` are masked.
    pub key_lengths: Option<&'a [usize]>,
    /// Boolean keep-mask broadcastable to `[B, Hq, Lq, Lk]` (`true` = may attend).
    pub keep: Option<Broadcast<'a, bool>>,
    /// Additive bias broadcastable to `[B, Hq, Lq, Lk]`, added to the (soft-capped) scaled scores.
    pub bias: Option<Broadcast<'a, T>>,
    /// A block-sparse (and programmable) mask: the flash kernels visit only its listed blocks.
    pub block: Option<&'a BlockMask>,
}

/// The band masks of one call resolved to numbers: the contiguous key range of any query row.
#[derive(Debug, Clone, Copy)]
pub struct Band {
    offset: isize,
    left: Option<usize>,
    right: Option<usize>,
    lk: usize,
}

impl Band {
    /// Band for `lq` queries over `lk` keys.
    pub fn new(causal: bool, window: Option<Window>, align: Align, lq: usize, lk: usize) -> Self {
        let offset = match align {
            Align::TopLeft => 0,
            Align::BottomRight => lk as isize - lq as isize,
        };
        let w = window.unwrap_or_default();
        let right = if causal { Some(0) } else { w.right };
        Self { offset, left: w.left, right, lk }
    }

    /// Allowed keys of query row `i` given `key_len` valid keys: the half-open range `lo..hi`
    /// (empty when `lo >= hi`).
    #[inline]
    pub fn keys(&self, i: usize, key_len: usize) -> (usize, usize) {
        let c = i as isize + self.offset;
        let lo = self.left.map_or(0, |l| (c - l as isize).max(0)) as usize;
        let hi_incl = self.right.map_or(isize::MAX, |r| c.saturating_add(r as isize));
        let end = key_len.min(self.lk) as isize;
        let hi = if hi_incl < 0 { 0 } else { (hi_incl.saturating_add(1)).min(end).max(0) as usize };
        (lo.min(hi), hi)
    }
}

/// The element-wise parts of a mask resolved against `[B, Hq, Lq, Lk]`.
#[derive(Debug, Clone, Copy)]
pub struct ElementMask<'a, T> {
    /// Boolean keep-mask.
    pub keep: Option<Resolved<'a, bool>>,
    /// Additive bias.
    pub bias: Option<Resolved<'a, T>>,
    /// Block-sparse mask, checked against the call's sizes.
    pub block: Option<&'a BlockMask>,
}
