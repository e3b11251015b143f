//! The primitive patterns every named pattern is made of, each a [`MaskMod`] whose blocks are
//! classified in O(rows of a block) or O(1), so that building a [`BlockMask`](super::BlockMask)
//! from them costs O(blocks), not O(Lq·Lk):
//! - interval patterns, where each query row allows one contiguous range of keys: [`Band`]
//!   (causal in both alignments, sliding windows), [`GlobalKeys`], [`GlobalQueries`],
//!   [`Documents`] (packed sequences), [`PrefixLm`], [`SameChunk`];
//! - column patterns: [`StrideColumns`] (Sparse Transformer's strided heads), [`SummaryColumns`]
//!   (its fixed heads);
//! - [`RandomBlocks`] (BigBird's seeded random key blocks per query block).
//!
//! Unions and intersections are [`MaskModExt::or`](super::MaskModExt::or) / `and`; the named
//! patterns of `named` are built that way.

use std::ops::Range;

use super::{BlockClass, MaskMod, SPARSE_BLOCK};
use crate::mask::{Align, Window};

/// The class of block `qs × ks` when query row `i` allows exactly the keys `row(i)`.
fn classify_intervals(qs: Range<usize>, ks: &Range<usize>, row: impl Fn(usize) -> Range<usize>) -> BlockClass {
    let (mut any, mut all) = (false, true);
    for i in qs {
        let r = row(i);
        let (a, z) = (r.start.max(ks.start), r.end.min(ks.end));
        any |= a < z;
        all &= a <= ks.start && z >= ks.end;
        if any && !all {
            return BlockClass::Partial;
        }
    }
    BlockClass::of(any, all)
}

/// `MaskMod` for a pattern with an inherent `interval(&self, i) -> Range<usize>` method (the keys
/// query row `i` allows, the same for every batch entry and head).
macro_rules! interval_mask_mod {
    ($($t:ty),*) => {$(
        impl MaskMod for $t {
            fn keep(&self, _b: usize, _h: usize, q: usize, kv: usize) -> bool {
                self.interval(q).contains(&kv)
            }
            fn keep_row(&self, _b: usize, _h: usize, q: usize, kv0: usize, out: &mut [bool]) {
                let r = self.interval(q);
                for (c, o) in out.iter_mut().enumerate() {
                    *o = r.contains(&(kv0 + c));
                }
            }
            fn classify(&self, _b: usize, _h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
                classify_intervals(qs, &ks, |i| self.interval(i))
            }
        }
    )*};
}

/// Causal masking and sliding windows around the aligned diagonal, with the semantics of
/// [`MaskSpec`](crate::MaskSpec)'s `causal`, `window` and `align` (see [`crate::mask`]).
#[derive(Debug, Clone, Copy)]
pub struct Band(crate::mask::Band);

impl Band {
    /// The band of `causal` and `window` aligned by `align`, for `lq` queries over `lk` keys.
    pub fn new(causal: bool, window: Option<Window>, align: Align, lq: usize, lk: usize) -> Self {
        Self(crate::mask::Band::new(causal, window, align, lq, lk))
    }
    fn interval(&self, i: usize) -> Range<usize> {
        let (lo, hi) = self.0.keys(i, usize::MAX);
        lo..hi
    }
}

/// The first `n` keys, seen by every query (Longformer's and BigBird's global columns,
/// StreamingLLM's sink tokens).
#[derive(Debug, Clone, Copy)]
pub struct GlobalKeys(pub usize);

impl GlobalKeys {
    fn interval(&self, _i: usize) -> Range<usize> {
        0..self.0
    }
}

/// The first `n` queries see every key (Longformer's and BigBird's global rows).
#[derive(Debug, Clone, Copy)]
pub struct GlobalQueries(pub usize);

impl GlobalQueries {
    fn interval(&self, i: usize) -> Range<usize> {
        if i < self.0 {
            0..usize::MAX
        } else {
            0..0
        }
    }
}

/// Packed documents: queries and keys are cut alike into documents of the given lengths, and a
/// query sees the keys of its own document (only those up to itself when `causal`). Positions past
/// the last document see nothing.
#[derive(Debug, Clone)]
pub struct Documents {
    starts: Vec<usize>,
    causal: bool,
}

impl Documents {
    /// Documents of `lengths` in order from position 0.
    pub fn new(lengths: &[usize], causal: bool) -> Self {
        let mut starts = vec![0];
        for &n in lengths {
            starts.push(starts.last().unwrap() + n);
        }
        Self { starts, causal }
    }
    fn interval(&self, i: usize) -> Range<usize> {
        let d = self.starts.partition_point(|&s| s <= i);
        if d == 0 || d >= self.starts.len() {
            return 0..0;
        }
        let (a, z) = (self.starts[d - 1], self.starts[d]);
        a..if self.causal { i + 1 } else { z }
    }
}

/// Prefix-LM: every query sees the first `n` keys (the prefix, bidirectional) and, causally, the
/// keys up to itself.
#[derive(Debug, Clone, Copy)]
pub struct PrefixLm(pub usize);

impl PrefixLm {
    fn interval(&self, i: usize) -> Range<usize> {
        0..self.0.max(i + 1)
    }
}

/// Causal attention inside chunks of `n` positions (Sparse Transformer's fixed pattern, first
/// part: `⌊j/n⌋ = ⌊i/n⌋`, `j ≤ i`).
#[derive(Debug, Clone, Copy)]
pub struct SameChunk(pub usize);

impl SameChunk {
    fn interval(&self, i: usize) -> Range<usize> {
        let n = self.0.max(1);
        i / n * n..i + 1
    }
}

interval_mask_mod!(Band, GlobalKeys, GlobalQueries, Documents, PrefixLm, SameChunk);

/// Sparse Transformer's strided pattern, second part: keys `j ≤ i` with `i − j` a multiple of the
/// stride.
#[derive(Debug, Clone, Copy)]
pub struct StrideColumns(pub usize);

impl MaskMod for StrideColumns {
    fn keep(&self, _b: usize, _h: usize, q: usize, kv: usize) -> bool {
        kv <= q && (q - kv).is_multiple_of(self.0.max(1))
    }
    fn classify(&self, _b: usize, _h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        // The differences `i − j` of the block fill one interval; it holds a multiple of the stride
        // at or above 0 or it does not.
        let s = self.0.max(1) as isize;
        let (lo, hi) = ((qs.start as isize - ks.end as isize + 1).max(0), qs.end as isize - 1 - ks.start as isize);
        if qs.is_empty() || ks.is_empty() || hi < lo || (lo + s - 1) / s * s > hi {
            BlockClass::Empty
        } else if s == 1 && ks.end <= qs.start + 1 {
            BlockClass::Full
        } else {
            BlockClass::Partial
        }
    }
}

/// Sparse Transformer's fixed pattern, second part: the last `c` positions of every chunk of `n`
/// (the summary columns), seen by every later query.
#[derive(Debug, Clone, Copy)]
pub struct SummaryColumns {
    /// Chunk length.
    pub n: usize,
    /// Summary positions per chunk.
    pub c: usize,
}

impl MaskMod for SummaryColumns {
    fn keep(&self, _b: usize, _h: usize, q: usize, kv: usize) -> bool {
        let n = self.n.max(1);
        kv <= q && kv % n >= n.saturating_sub(self.c)
    }
    fn classify(&self, _b: usize, _h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        let n = self.n.max(1);
        let summary = |j: usize| j % n >= n.saturating_sub(self.c);
        // Keys any query of the block may see: `ks` up to the last query.
        let reach = ks.start..ks.end.min(qs.end);
        if qs.is_empty() || !reach.clone().any(summary) {
            BlockClass::Empty
        } else if ks.end <= qs.start + 1 && ks.clone().all(summary) {
            BlockClass::Full
        } else {
            BlockClass::Partial
        }
    }
}

/// BigBird's random attention: each query block sees `r` distinct key blocks drawn from `seed`
/// (the same for every batch entry and head), whole.
#[derive(Debug, Clone)]
pub struct RandomBlocks {
    /// Per query block, its key blocks, sorted.
    chosen: Vec<Vec<usize>>,
}

impl RandomBlocks {
    /// `r` key blocks (at most all of them) for each query block of `lq × lk`.
    pub fn new(r: usize, seed: u64, lq: usize, lk: usize) -> Self {
        let (nq, nk) = (lq.div_ceil(SPARSE_BLOCK), lk.div_ceil(SPARSE_BLOCK));
        let chosen = (0..nq)
            .map(|qb| {
                let mut rng = crate::rng::SplitMix64::new(seed ^ (qb as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                // A partial Fisher–Yates shuffle: the first `r` of a random permutation.
                let mut all: Vec<usize> = (0..nk).collect();
                let r = r.min(nk);
                for x in 0..r {
                    let y = x + (rng.next_u64() % (nk - x) as u64) as usize;
                    all.swap(x, y);
                }
                let mut pick = all[..r].to_vec();
                pick.sort_unstable();
                pick
            })
            .collect();
        Self { chosen }
    }
    fn has(&self, qb: usize, kb: usize) -> bool {
        self.chosen.get(qb).is_some_and(|c| c.binary_search(&kb).is_ok())
    }
}

impl MaskMod for RandomBlocks {
    fn keep(&self, _b: usize, _h: usize, q: usize, kv: usize) -> bool {
        self.has(q / SPARSE_BLOCK, kv / SPARSE_BLOCK)
    }
    fn classify(&self, _b: usize, _h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        let blocks = |r: &Range<usize>| r.start / SPARSE_BLOCK..r.end.div_ceil(SPARSE_BLOCK);
        let pairs = blocks(&qs).flat_map(|qb| blocks(&ks).map(move |kb| (qb, kb)));
        let (mut any, mut all) = (false, true);
        for (qb, kb) in pairs {
            let has = self.has(qb, kb);
            (any, all) = (any || has, all && has);
        }
        BlockClass::of(any, all)
    }
}
