//! A [`BlockMask`] as the kernels apply it: the keep bits of one query row over one tile of at most
//! [`TILE_BITS`] keys ([`BlockMask::keep_bits`], bit `c` of word `c / 64` for key `j0 + c`), which
//! the flash kernels turn into vector selects; and the scalar [`BlockMask::mask_row`] and pair
//! count built on them.
//!
//! How a row's bits are found: the tile's keys are cut at block edges into segments (empty, full,
//! or partial with its list entry) by one search of the row's block list; the rows of a tile
//! share their query block (a flash job lies inside one), so the segments are kept in a
//! [`TileBlocks`] and searched again only when the query block, head group or tile changes. A row
//! then costs one shift per segment: empty segments stay 0, full ones all ones, partial ones take
//! the row's word from the mask's build. A kernel whose rows need nothing but the block mask may
//! read the segments themselves ([`BlockMask::segments`], [`BlockMask::block_word`]) and select
//! a block's vectors straight from its word.

use std::ops::Range;

use super::{BlockMask, SPARSE_BLOCK};

/// The most keys one [`BlockMask::keep_bits`] covers.
pub(crate) const TILE_BITS: usize = 256;

/// The keep bits of a row over a tile: bit `c % 64` of word `c / 64` for the tile's key `c`.
pub(crate) type TileWords = [u64; TILE_BITS / 64];

/// What a tile's segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seg {
    Empty,
    Full,
    /// A partial block: its list entry (see [`BlockMask::block_word`]).
    Partial(usize),
}

/// The segments of the last tile asked about, kept from row to row (each worker holds one).
#[derive(Debug, Default)]
pub(crate) struct TileBlocks {
    /// `(list row, j0, n)` the segments belong to.
    key: Option<(usize, usize, usize)>,
    /// `(first tile column, columns, class)`, in key order.
    segs: Vec<(usize, usize, Seg)>,
}

impl TileBlocks {
    /// Forgets the tile last asked about, for buffers kept from one call to the next: another
    /// call's mask may have a tile at the same place.
    pub(crate) fn forget(&mut self) {
        self.key = None;
    }
}

/// `len` ones (`len <= 64`).
fn ones(len: usize) -> u64 {
    if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    }
}

impl BlockMask {
    /// The keep bits of query `i` of `(b, h)` over keys `j0..j0 + n` (`n <= TILE_BITS`) by this
    /// mask alone: bits of full blocks set, of partial blocks as the predicate decided when the
    /// mask was built, of empty blocks and beyond `n` clear. `tb` carries the tile's segments
    /// from one call to the next.
    #[inline(always)]
    pub(crate) fn keep_bits(
        &self,
        b: usize,
        h: usize,
        i: usize,
        j0: usize,
        n: usize,
        tb: &mut TileBlocks,
    ) -> TileWords {
        debug_assert!(n <= TILE_BITS, "a tile of {n} keys is more than {TILE_BITS}");
        let mut words = [0u64; TILE_BITS / 64];
        for &(at, len, seg) in self.segments(b, h, i / SPARSE_BLOCK, j0, n, tb) {
            let v = match seg {
                Seg::Empty => continue,
                Seg::Full => ones(len),
                Seg::Partial(entry) => (self.block_word(entry, i) >> ((j0 + at) % SPARSE_BLOCK)) & ones(len),
            };
            let (w, sh) = (at / 64, at % 64);
            words[w] |= v << sh;
            if sh > 0 && w + 1 < words.len() {
                words[w + 1] |= v >> (64 - sh);
            }
        }
        words
    }

    /// The keys `j0..j0 + n` cut at block edges as query block `qb` of `(b, h)` sees them:
    /// `(first column, columns, class)` in key order, kept in `tb` and searched again only when
    /// the block's list row or the keys change.
    #[inline(always)]
    pub(crate) fn segments<'t>(
        &self,
        b: usize,
        h: usize,
        qb: usize,
        j0: usize,
        n: usize,
        tb: &'t mut TileBlocks,
    ) -> &'t [(usize, usize, Seg)] {
        let (r, first, blocks, full) = self.kv_row(b, h, qb);
        if tb.key != Some((r, j0, n)) {
            tb.key = Some((r, j0, n));
            tb.segs.clear();
            let mut x = blocks.partition_point(|&kb| (kb as usize) < j0 / SPARSE_BLOCK);
            let (mut j, end) = (j0, j0 + n);
            while j < end {
                let kb = j / SPARSE_BLOCK;
                let seg_end = ((kb + 1) * SPARSE_BLOCK).min(end);
                let seg = match blocks.get(x) {
                    Some(&listed) if listed as usize == kb => {
                        x += 1;
                        if full[x - 1] {
                            Seg::Full
                        } else {
                            Seg::Partial(first + x - 1)
                        }
                    }
                    _ => Seg::Empty,
                };
                tb.segs.push((j - j0, seg_end - j, seg));
                j = seg_end;
            }
        }
        &tb.segs
    }

    /// The keep bits of query `i` over the whole block of the partial list entry `entry` (a
    /// [`Seg::Partial`] of a row of `i`'s query block): bit `c` for the block's key `c`.
    #[inline(always)]
    pub(crate) fn block_word(&self, entry: usize, i: usize) -> u64 {
        self.word(entry, i % SPARSE_BLOCK)
    }

    /// Whether every key of `j0..j0 + n` lies in a block listed as full for query block `qb` of
    /// `(b, h)`: then this mask keeps every pair of those keys for every row of the query block,
    /// and the kernels need not mask them row by row.
    #[inline]
    pub(crate) fn full_over(&self, b: usize, h: usize, qb: usize, j0: usize, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let (_, _, blocks, full) = self.kv_row(b, h, qb);
        let (first, last) = (j0 / SPARSE_BLOCK, (j0 + n - 1) / SPARSE_BLOCK);
        let x = blocks.partition_point(|&kb| (kb as usize) < first);
        let want = last - first + 1;
        x + want <= blocks.len()
            && blocks[x + want - 1] as usize == last
            && blocks[x] as usize == first
            && full[x..x + want].iter().all(|&f| f)
    }

    /// Sets to −∞ the scores `row` (keys `j0..j0 + row.len()`) of query `i` of `(b, h)` that this
    /// mask forbids; returns whether any score was. Scalar: for pictures and counts (the kernels
    /// select with `keep_bits` in vectors).
    pub fn mask_row(&self, b: usize, h: usize, i: usize, j0: usize, row: &mut [f32]) -> bool {
        let mut tb = TileBlocks::default();
        let mut masked = false;
        for (t, part) in row.chunks_mut(TILE_BITS).enumerate() {
            let words = self.keep_bits(b, h, i, j0 + t * TILE_BITS, part.len(), &mut tb);
            for (c, s) in part.iter_mut().enumerate() {
                if words[c / 64] >> (c % 64) & 1 == 0 {
                    *s = f32::NEG_INFINITY;
                    masked = true;
                }
            }
        }
        masked
    }

    /// How many keys of `keys` query `i` of `(b, h)` may attend by this mask alone: the keys of
    /// its full blocks, and those of its partial blocks that the predicate keeps. The cost is that
    /// of the listed blocks the row crosses, never O(Lk).
    pub fn allowed(&self, b: usize, h: usize, i: usize, keys: Range<usize>) -> usize {
        let (_, _, blocks, _) = self.kv_row(b, h, i / SPARSE_BLOCK);
        let mut tb = TileBlocks::default();
        blocks
            .iter()
            .map(|&kb| {
                let kb = kb as usize;
                let (a, z) = ((kb * SPARSE_BLOCK).max(keys.start), ((kb + 1) * SPARSE_BLOCK).min(keys.end));
                if a >= z {
                    return 0;
                }
                self.keep_bits(b, h, i, a, z - a, &mut tb)[0].count_ones() as usize
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{BlockClass, BlockShape, Pattern};
    use super::*;

    #[test]
    fn counts_what_allows_says_over_any_key_range() {
        let (lq, lk) = (150, 200);
        let p = Pattern::Strided { stride: 7 };
        let m = BlockMask::build(BlockShape { batch: 1, heads: 1, lq, lk }, p.mask_mod(lq, lk).unwrap()).unwrap();
        for i in [0, 1, 63, 64, 100, 149] {
            for keys in [0..lk, 5..130, 64..128, 70..70, 190..200] {
                let want = keys.clone().filter(|&j| m.allows(0, 0, i, j)).count();
                assert_eq!(m.allowed(0, 0, i, keys.clone()), want, "row {i}, keys {keys:?}");
            }
        }
        let all = BlockMask::build(BlockShape { batch: 1, heads: 1, lq, lk }, Arc::new(|_, _, _, _| true)).unwrap();
        assert_eq!(all.allowed(0, 0, 3, 0..lk), lk);
    }

    /// Every bit of a row over tiles at any start (block-aligned or not, crossing words and
    /// blocks, empty, full and partial blocks, short tiles) says what `allows` says, and bits
    /// beyond the tile are clear; one `TileBlocks` carried across rows and tiles, as the kernels do.
    #[test]
    fn keep_bits_say_what_allows_says() {
        let (lq, lk) = (200, 700);
        let window = crate::Window { left: Some(40), right: Some(40) };
        let p = Pattern::BigBird { window, global: 3, random: 2, seed: 5 };
        let m = BlockMask::build(BlockShape { batch: 1, heads: 2, lq, lk }, p.mask_mod(lq, lk).unwrap()).unwrap();
        let mut tb = TileBlocks::default();
        for h in 0..2 {
            for qb in 0..lq.div_ceil(SPARSE_BLOCK) {
                for (j0, n) in [(0, 256), (64, 128), (70, 30), (128, 64), (600, 100), (444, 1), (690, 10), (5, 0)] {
                    let rows = qb * SPARSE_BLOCK..((qb + 1) * SPARSE_BLOCK).min(lq);
                    let all = (j0..j0 + n).all(|j| m.class(0, h, qb, j / SPARSE_BLOCK) == BlockClass::Full);
                    assert_eq!(m.full_over(0, h, qb, j0, n), all, "head {h}, query block {qb}, keys {j0}+{n}");
                    if all {
                        assert!(rows.clone().all(|i| (j0..j0 + n).all(|j| m.allows(0, h, i, j))));
                    }
                }
            }
            for i in [0, 5, 63, 64, 130, 199] {
                for (j0, n) in [(0, 256), (32, 256), (5, 200), (64, 64), (600, 100), (444, 1), (690, 10)] {
                    let words = m.keep_bits(0, h, i, j0, n, &mut tb);
                    for c in 0..TILE_BITS {
                        let bit = words[c / 64] >> (c % 64) & 1 == 1;
                        let want = c < n && m.allows(0, h, i, j0 + c);
                        assert_eq!(bit, want, "head {h}, row {i}, tile {j0}+{n}, column {c}");
                    }
                }
            }
        }
    }
}
