//! The element masks of one row of a score tile, each applied where `scores::mask_row` calls it in
//! the reference's order: an additive bias (−∞ masks whatever the score), a boolean keep row, and
//! a block mask's keep bits. The bias and the block mask run in vectors (`select_lt`,
//! `select_bits`); a keep row that allows the whole tile costs one byte search. Each returns
//! whether it masked a key of the tile.

use crate::simd::Simd;
use crate::sparse::{TileWords, TILE_BITS};

/// Sets to −∞ the scores of `row` (whole vectors) whose bit in `words` (a block mask's
/// [`TileWords`]) is clear, a vector select per `W` columns, over the vectors that cover the first
/// `n`; returns whether any of the first `n` was.
///
/// # Safety
/// The CPU supports `S`'s instruction set; `row.len()` is a multiple of `S::W`, `>= n`.
#[inline(always)]
pub(super) unsafe fn select_kept<S: Simd>(row: &mut [f32], words: &TileWords, n: usize) -> bool {
    debug_assert!(n <= TILE_BITS && row.len() >= n.div_ceil(S::W) * S::W);
    let lanes = (1u32 << S::W) - 1;
    let mut masked = false;
    for c in (0..n).step_by(S::W) {
        // `W` divides 64, so a vector's bits lie in one word.
        let bits = (words[c / 64] >> (c % 64)) as u32 & lanes;
        let valid = if n - c >= S::W { lanes } else { (1u32 << (n - c)) - 1 };
        if bits & valid != valid {
            masked = true;
            // SAFETY: the CPU supports `S`; columns `c..c + W` lie in `row` (whole vectors).
            unsafe {
                let p = row.as_mut_ptr().add(c);
                S::store(p, S::select_bits(bits, S::load(p), S::splat(f32::NEG_INFINITY)));
            }
        }
    }
    masked
}

/// Adds the bias row `bv` (keys `j0..`; stride `st` along keys, 1, or 0 when broadcast, as every
/// [`crate::Broadcast`] row has) to the scores `row` (keys `j0..j0 + row.len()`); a bias of −∞
/// masks its key whatever the score (NaN and +∞ included). Returns whether any key of the tile
/// was masked so.
///
/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
pub(super) unsafe fn add_bias<S: Simd>(row: &mut [f32], bv: &[f32], st: usize, j0: usize) -> bool {
    debug_assert!(st <= 1, "broadcast rows are contiguous along keys");
    let add = |s: &mut f32, x: f32| *s = if x == f32::NEG_INFINITY { f32::NEG_INFINITY } else { *s + x };
    if st == 0 {
        row.iter_mut().for_each(|s| add(s, bv[0]));
        return bv[0] == f32::NEG_INFINITY;
    }
    let bv = &bv[j0..][..row.len()];
    let whole = row.len() / S::W * S::W;
    // SAFETY: the CPU supports `S` (the caller's contract); the loop reads and writes whole
    // vectors inside `row` and `bv` (both `row.len()` long).
    let lowest = unsafe {
        let (ninf, below) = (S::splat(f32::NEG_INFINITY), S::splat(f32::MIN));
        let mut lowest = S::splat(0.0);
        for c in (0..whole).step_by(S::W) {
            let (sp, x) = (row.as_mut_ptr().add(c), S::load(bv.as_ptr().add(c)));
            S::store(sp, S::select_lt(x, below, ninf, S::add(S::load(sp), x)));
            lowest = S::min(x, lowest);
        }
        -S::reduce_max(S::mul(lowest, S::splat(-1.0)))
    };
    row[whole..].iter_mut().zip(&bv[whole..]).for_each(|(s, &x)| add(s, x));
    lowest == f32::NEG_INFINITY || bv[whole..].contains(&f32::NEG_INFINITY)
}

/// Sets the scores `row` (keys `j0..j0 + row.len()`) of keys the keep row `kv` (keys `j0..`;
/// stride `st` as for [`add_bias`]) forbids to −∞; returns whether any was. A tile whose keys are
/// all kept costs one byte search.
#[inline(always)]
pub(super) fn apply_keep(row: &mut [f32], kv: &[bool], st: usize, j0: usize) -> bool {
    debug_assert!(st <= 1, "broadcast rows are contiguous along keys");
    if st == 0 {
        if !kv[0] {
            row.fill(f32::NEG_INFINITY);
        }
        return !kv[0];
    }
    let kv = &kv[j0..][..row.len()];
    // SAFETY: `bool` is one byte holding 0 or 1, so a `[bool]` is a valid `[u8]` of the same length.
    let bytes = unsafe { std::slice::from_raw_parts(kv.as_ptr().cast::<u8>(), kv.len()) };
    if !bytes.contains(&0) {
        return false;
    }
    for (s, &k) in row.iter_mut().zip(kv) {
        if !k {
            *s = f32::NEG_INFINITY;
        }
    }
    true
}
