//! Counting the pairs a [`BlockMask`] allows, for FLOP counts and densities stated in pairs
//! rather than blocks: the cost is that of the listed blocks a row crosses, never O(Lk).

use std::ops::Range;

use super::{BlockMask, SPARSE_BLOCK};

impl BlockMask {
    /// How many keys of `keys` query `i` of `(b, h)` may attend by this mask alone: the keys of
    /// its full blocks, and those of its partial blocks that the predicate keeps.
    pub fn allowed(&self, b: usize, h: usize, i: usize, keys: Range<usize>) -> usize {
        let (blocks, _) = self.kv_blocks(b, h, i / SPARSE_BLOCK);
        let mut row = [0f32; SPARSE_BLOCK];
        blocks
            .iter()
            .map(|&kb| {
                let kb = kb as usize;
                let (a, z) = ((kb * SPARSE_BLOCK).max(keys.start), ((kb + 1) * SPARSE_BLOCK).min(keys.end));
                if a >= z {
                    return 0;
                }
                let seg = &mut row[..z - a];
                seg.fill(0.0);
                self.mask_row(b, h, i, a, seg);
                seg.iter().filter(|s| s.is_finite()).count()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{BlockShape, Pattern};
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
}
