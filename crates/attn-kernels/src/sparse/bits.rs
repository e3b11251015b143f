//! The pairs of every partial block, decided once when a [`BlockMask`](super::BlockMask) is built:
//! one 64-bit word per query row of a partial block (bit `c` = the block's key `c` is kept), so the
//! kernels mask a row of a partial block with one word instead of calling the predicate.

use rayon::prelude::*;

use super::{BlockShape, MaskMod, SPARSE_BLOCK};

/// The words of the partial blocks, indexed by their entry in the block lists.
#[derive(Debug, Clone, Default)]
pub(super) struct PartialBits {
    /// Per list entry, the index of its first word (`u32::MAX` for a full entry).
    at: Vec<u32>,
    /// `SPARSE_BLOCK` words per partial entry.
    words: Vec<u64>,
}

/// A partial entry of the lists: its index, batch, head, query block and key block.
pub(super) type PartialEntry = (usize, usize, usize, usize, usize);

impl PartialBits {
    /// The words of the `partial` entries among `entries` list entries of a mask of `shape`, from
    /// `m`'s rows.
    pub(super) fn build(shape: &BlockShape, entries: usize, partial: &[PartialEntry], m: &dyn MaskMod) -> Self {
        let mut at = vec![u32::MAX; entries];
        for (x, p) in partial.iter().enumerate() {
            at[p.0] = (x * SPARSE_BLOCK) as u32;
        }
        let words = partial
            .par_iter()
            .flat_map_iter(|&(_, b, h, qb, kb)| {
                let (qs, ks) = shape.block(qb, kb);
                let mut keep = [false; SPARSE_BLOCK];
                (0..SPARSE_BLOCK).map(move |r| {
                    let i = qs.start + r;
                    if i >= qs.end {
                        return 0;
                    }
                    let keep = &mut keep[..ks.len()];
                    m.keep_row(b, h, i, ks.start, keep);
                    keep.iter().enumerate().fold(0u64, |w, (c, &k)| w | (u64::from(k) << c))
                })
            })
            .collect();
        Self { at, words }
    }

    /// The word of row `r` of list entry `entry` (a partial one).
    #[inline]
    pub(super) fn word(&self, entry: usize, r: usize) -> u64 {
        self.words[self.at[entry] as usize + r]
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        self.at.len() * 4 + self.words.len() * 8
    }
}
