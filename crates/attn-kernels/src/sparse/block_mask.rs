//! [`BlockMask`]: the block-sparse description of a mask (FlexAttention's `BlockMask`), built once
//! from a [`MaskMod`] ([`BlockMask::build`], PyTorch's `create_block_mask`) or from explicit block
//! lists ([`BlockMask::from_lists`]), then reused across calls, layers and the backward.
//!
//! Storage is O(listed blocks), never O(Lq·Lk): for each `(batch, head, query block)` the sorted
//! key blocks it touches with their class (`kv`), the transposed lists, for each
//! `(batch, head, key block)` the query blocks touching it (`q`), which the backward walks, and the
//! pairs of each partial block as 64 words of 64 bits (`bits`, 512 bytes per partial block). A
//! batch or head count of 1 broadcasts over the call's.

use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use super::bits::{PartialBits, PartialEntry};
use super::{BlockClass, MaskMod, SPARSE_BLOCK};
use crate::error::{AttnError, Result};

/// The sizes a [`BlockMask`] describes: `batch` and `heads` (1 broadcasts over the call's `B` or
/// `Hq`), `lq` queries and `lk` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    /// Batch entries described (1: the same for every entry).
    pub batch: usize,
    /// Query heads described (1: the same for every head).
    pub heads: usize,
    /// Queries.
    pub lq: usize,
    /// Keys.
    pub lk: usize,
}

impl BlockShape {
    /// Query blocks, `⌈Lq / SPARSE_BLOCK⌉`.
    pub fn q_blocks(&self) -> usize {
        self.lq.div_ceil(SPARSE_BLOCK)
    }
    /// Key blocks, `⌈Lk / SPARSE_BLOCK⌉`.
    pub fn kv_blocks(&self) -> usize {
        self.lk.div_ceil(SPARSE_BLOCK)
    }
    /// `(batch, head, query block)` rows of the lists.
    pub fn rows(&self) -> usize {
        self.batch * self.heads * self.q_blocks()
    }
    /// The queries of query block `qb` and the keys of key block `kb`.
    pub fn block(&self, qb: usize, kb: usize) -> (Range<usize>, Range<usize>) {
        let at = |x: usize, len: usize| x * SPARSE_BLOCK..((x + 1) * SPARSE_BLOCK).min(len);
        (at(qb, self.lq), at(kb, self.lk))
    }
}

/// Lists in compressed rows: row `r` holds `blocks[offsets[r]..offsets[r + 1]]`, sorted, each
/// with whether it is full.
#[derive(Debug, Clone, Default)]
struct Lists {
    offsets: Vec<usize>,
    blocks: Vec<u32>,
    full: Vec<bool>,
}

impl Lists {
    fn from_rows(rows: Vec<Vec<(u32, bool)>>) -> Self {
        let mut l = Lists { offsets: Vec::with_capacity(rows.len() + 1), ..Default::default() };
        l.offsets.push(0);
        for row in rows {
            l.blocks.extend(row.iter().map(|x| x.0));
            l.full.extend(row.iter().map(|x| x.1));
            l.offsets.push(l.blocks.len());
        }
        l
    }

    #[inline]
    fn row(&self, r: usize) -> (&[u32], &[bool]) {
        let span = self.offsets[r]..self.offsets[r + 1];
        (&self.blocks[span.clone()], &self.full[span])
    }

    /// The lists with rows and columns swapped inside each group of `rows` rows (one head): row
    /// `g·rows + r` holding column `c` becomes row `g·cols + c` holding `r`.
    fn transposed(&self, rows: usize, cols: usize) -> Self {
        let groups = (self.offsets.len() - 1) / rows.max(1);
        let mut out = vec![Vec::new(); groups * cols];
        for g in 0..groups {
            for r in 0..rows {
                let (bl, fl) = self.row(g * rows + r);
                for (&c, &f) in bl.iter().zip(fl) {
                    out[g * cols + c as usize].push((r as u32, f));
                }
            }
        }
        Self::from_rows(out)
    }
}

/// The block-sparse description of a mask (see the [module](super) header).
#[derive(Clone)]
pub struct BlockMask {
    shape: BlockShape,
    kv: Lists,
    q: Lists,
    mask_mod: Option<Arc<dyn MaskMod>>,
    /// The partial blocks' pairs, decided by `mask_mod` when the mask was built.
    bits: PartialBits,
}

impl std::fmt::Debug for BlockMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockMask")
            .field("shape", &self.shape)
            .field("listed", &self.kv.blocks.len())
            .field("full", &self.kv.full.iter().filter(|&&x| x).count())
            .field("mask_mod", &self.mask_mod.is_some())
            .finish()
    }
}

impl BlockMask {
    /// Classifies every block of `shape` with `mask_mod` ([`MaskMod::classify`], in parallel) and
    /// keeps the predicate for the partial blocks.
    pub fn build(shape: BlockShape, mask_mod: Arc<dyn MaskMod>) -> Result<Self> {
        check_shape(&shape)?;
        let (nq, nk) = (shape.q_blocks(), shape.kv_blocks());
        let rows: Vec<Vec<(u32, bool)>> = (0..shape.rows())
            .into_par_iter()
            .map(|r| {
                let (bh, qb) = (r / nq, r % nq);
                let (b, h) = (bh / shape.heads, bh % shape.heads);
                (0..nk)
                    .filter_map(|kb| {
                        let (qs, ks) = shape.block(qb, kb);
                        match mask_mod.classify(b, h, qs, ks) {
                            BlockClass::Empty => None,
                            c => Some((kb as u32, c == BlockClass::Full)),
                        }
                    })
                    .collect()
            })
            .collect();
        Ok(Self::new(shape, rows, Some(mask_mod)))
    }

    /// A mask from explicit lists, one entry per `(batch, head, query block)` row in that order
    /// (`(b·heads + h)·q_blocks + qb`): `partial[r]` the key blocks the predicate `mask_mod` decides,
    /// `full[r]` those wholly allowed, each strictly increasing (FlexAttention's `kv_indices` and
    /// `full_kv_indices`). Refuses rows of the wrong count, indices out of range, unsorted or
    /// duplicate blocks, a block in both lists, and partial blocks without a predicate.
    pub fn from_lists(
        shape: BlockShape,
        partial: &[Vec<usize>],
        full: &[Vec<usize>],
        mask_mod: Option<Arc<dyn MaskMod>>,
    ) -> Result<Self> {
        check_shape(&shape)?;
        let nk = shape.kv_blocks();
        let mut rows = Vec::with_capacity(shape.rows());
        for (field, lists) in [("block_mask.kv_indices", partial), ("block_mask.full_kv_indices", full)] {
            if lists.len() != shape.rows() {
                let reason = format!(
                    "{} rows, expected batch·heads·query blocks = {}·{}·{} = {}",
                    lists.len(),
                    shape.batch,
                    shape.heads,
                    shape.q_blocks(),
                    shape.rows()
                );
                return Err(AttnError::Param { field, reason });
            }
            for (r, list) in lists.iter().enumerate() {
                let bad = |reason: String| Err(AttnError::Param { field, reason: format!("row {r}: {reason}") });
                if let Some(&kb) = list.iter().find(|&&kb| kb >= nk) {
                    return bad(format!("key block {kb} out of range (the mask has {nk} key blocks)"));
                }
                if let Some(w) = list.windows(2).find(|w| w[0] >= w[1]) {
                    let what = if w[0] == w[1] { "duplicate" } else { "unsorted" };
                    return bad(format!("{what} key blocks {} then {}", w[0], w[1]));
                }
            }
        }
        if mask_mod.is_none() {
            if let Some(r) = partial.iter().position(|l| !l.is_empty()) {
                let reason = format!("row {r} lists partial blocks but no mask_mod decides their elements");
                return Err(AttnError::Param { field: "block_mask.kv_indices", reason });
            }
        }
        for (r, (p, f)) in partial.iter().zip(full).enumerate() {
            if let Some(kb) = p.iter().find(|kb| f.binary_search(kb).is_ok()) {
                let reason = format!("row {r}: key block {kb} is listed both partial and full");
                return Err(AttnError::Param { field: "block_mask.full_kv_indices", reason });
            }
            let mut row: Vec<(u32, bool)> =
                p.iter().map(|&kb| (kb as u32, false)).chain(f.iter().map(|&kb| (kb as u32, true))).collect();
            row.sort_unstable();
            rows.push(row);
        }
        Ok(Self::new(shape, rows, mask_mod))
    }

    fn new(shape: BlockShape, rows: Vec<Vec<(u32, bool)>>, mask_mod: Option<Arc<dyn MaskMod>>) -> Self {
        let kv = Lists::from_rows(rows);
        let q = kv.transposed(shape.q_blocks(), shape.kv_blocks());
        let nq = shape.q_blocks();
        let mut partial: Vec<PartialEntry> = Vec::new();
        for r in 0..kv.offsets.len() - 1 {
            let (g, qb) = (r / nq.max(1), r % nq.max(1));
            for e in kv.offsets[r]..kv.offsets[r + 1] {
                if !kv.full[e] {
                    partial.push((e, g / shape.heads, g % shape.heads, qb, kv.blocks[e] as usize));
                }
            }
        }
        let bits = match &mask_mod {
            Some(m) => PartialBits::build(&shape, kv.blocks.len(), &partial, &**m),
            None => PartialBits::default(),
        };
        Self { shape, kv, q, mask_mod, bits }
    }

    /// The sizes described.
    pub fn shape(&self) -> BlockShape {
        self.shape
    }

    /// Checks the mask against a call of `b` batch entries, `hq` query heads, `lq` queries and
    /// `lk` keys.
    pub fn check(&self, b: usize, hq: usize, lq: usize, lk: usize) -> Result<()> {
        let s = self.shape;
        let fits = |n: usize, call: usize| n == call || n == 1;
        if !(fits(s.batch, b) && fits(s.heads, hq) && s.lq == lq && s.lk == lk) {
            let reason = format!(
                "built for batch {}, heads {}, {}×{} but the call has batch {b}, {hq} query heads, {lq}×{lk} \
                 (batch and heads may also be 1)",
                s.batch, s.heads, s.lq, s.lk
            );
            return Err(AttnError::Param { field: "block_mask", reason });
        }
        Ok(())
    }

    /// The index of the `(b, h)` group of rows, broadcasting.
    #[inline]
    fn group(&self, b: usize, h: usize) -> usize {
        let (b, h) = (if self.shape.batch == 1 { 0 } else { b }, if self.shape.heads == 1 { 0 } else { h });
        b * self.shape.heads + h
    }

    /// The key blocks listed for query block `qb` of `(b, h)`, sorted, and whether each is full.
    pub fn kv_blocks(&self, b: usize, h: usize, qb: usize) -> (&[u32], &[bool]) {
        self.kv.row(self.group(b, h) * self.shape.q_blocks() + qb)
    }

    /// The query blocks listed for key block `kb` of `(b, h)`, sorted, and whether each is full.
    pub fn q_blocks(&self, b: usize, h: usize, kb: usize) -> (&[u32], &[bool]) {
        self.q.row(self.group(b, h) * self.shape.kv_blocks() + kb)
    }

    /// The class of block `(qb, kb)` of `(b, h)`.
    pub fn class(&self, b: usize, h: usize, qb: usize, kb: usize) -> BlockClass {
        class_in(self.kv_blocks(b, h, qb), kb)
    }

    /// Whether query `i` of `(b, h)` may attend key `j` by this mask alone (the reference's
    /// element test).
    pub fn allows(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        match self.class(b, h, i / SPARSE_BLOCK, j / SPARSE_BLOCK) {
            BlockClass::Empty => false,
            BlockClass::Full => true,
            BlockClass::Partial => self.mask_mod.as_ref().is_some_and(|m| m.keep(b, h, i, j)),
        }
    }

    /// The list row of query block `qb` of `(b, h)`: its index (a tile's cache key), the list
    /// entry of its first block, its key blocks (sorted) and whether each is full.
    #[inline]
    pub(super) fn kv_row(&self, b: usize, h: usize, qb: usize) -> (usize, usize, &[u32], &[bool]) {
        let r = self.group(b, h) * self.shape.q_blocks() + qb;
        let (blocks, full) = self.kv.row(r);
        (r, self.kv.offsets[r], blocks, full)
    }

    /// The word of query row `r` (within its block) of the partial list entry `entry`: bit `c` is
    /// the block's key `c`.
    #[inline]
    pub(super) fn word(&self, entry: usize, r: usize) -> u64 {
        self.bits.word(entry, r)
    }

    /// Listed blocks over all blocks of the described shape (the fraction of the work a call
    /// computes when every block is the same size), in `[0, 1]`.
    pub fn density(&self) -> f64 {
        let total = self.shape.rows() * self.shape.kv_blocks();
        if total == 0 {
            0.0
        } else {
            self.kv.blocks.len() as f64 / total as f64
        }
    }

    /// Bytes held by the lists.
    pub fn bytes(&self) -> usize {
        let l = |l: &Lists| l.offsets.len() * 8 + l.blocks.len() * 5;
        l(&self.kv) + l(&self.q) + self.bits.bytes()
    }
}

/// The class of block `kb` in a sorted list.
fn class_in((blocks, full): (&[u32], &[bool]), kb: usize) -> BlockClass {
    match blocks.binary_search(&(kb as u32)) {
        Ok(x) if full[x] => BlockClass::Full,
        Ok(_) => BlockClass::Partial,
        Err(_) => BlockClass::Empty,
    }
}

fn check_shape(s: &BlockShape) -> Result<()> {
    if s.batch == 0 || s.heads == 0 {
        let reason = format!("batch {} and heads {} must be at least 1", s.batch, s.heads);
        return Err(AttnError::Param { field: "block_mask", reason });
    }
    if s.kv_blocks() > u32::MAX as usize {
        return Err(AttnError::Param { field: "block_mask", reason: format!("{} keys are too many", s.lk) });
    }
    Ok(())
}
