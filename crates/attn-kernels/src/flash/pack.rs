//! Packing of one key head (or a range of its keys) into panels for the `qk_panel` micro-kernel: keys in groups of `2·W`,
//! each panel stored `[Dk][2·W]` (so a panel row is one vector pair), widened to f32, zero
//! beyond `Lk`. Done once per key/value head and shared by every query head of its group.

use std::ops::Range;

use super::simd::KvElem;
use crate::view::View4;

/// Floats needed for the panels of `lk` keys of dimension `dk` with vector width `w`
/// (`usize::MAX` when that overflows, which no buffer can hold).
pub fn panel_len(lk: usize, dk: usize, w: usize) -> usize {
    (lk.div_ceil(2 * w) * 2 * w).saturating_mul(dk)
}

/// Packs rows `keys` of head `(b, h)` of `k` (keys, or values in the backward) into `out`
/// (length [`panel_len`] of `keys.len()`), zero beyond `keys.end`.
pub fn pack_keys<E: KvElem>(k: &View4<E>, b: usize, h: usize, keys: Range<usize>, w: usize, out: &mut [f32]) {
    let dk = k.dims()[3];
    let pw = 2 * w;
    for (p, panel) in out.chunks_exact_mut(pw * dk).enumerate() {
        for c in 0..pw {
            let j = keys.start + p * pw + c;
            if j < keys.end {
                for (d, &x) in k.row(b, h, j).iter().enumerate() {
                    panel[d * pw + c] = x.to_f32();
                }
            } else {
                for d in 0..dk {
                    panel[d * pw + c] = 0.0;
                }
            }
        }
    }
}
