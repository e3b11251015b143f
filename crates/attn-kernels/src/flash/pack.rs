//! Packing of one key head into panels for the prefill micro-kernel: keys in groups of `2·W`,
//! each panel stored `[Dk][2·W]` (so a panel row is one vector pair), widened to f32, zero
//! beyond `Lk`. Done once per key/value head and shared by every query head of its group.

use super::simd::KvElem;
use crate::view::View4;

/// Floats needed for the panels of `lk` keys of dimension `dk` with vector width `w`.
pub fn panel_len(lk: usize, dk: usize, w: usize) -> usize {
    lk.div_ceil(2 * w) * 2 * w * dk
}

/// Packs keys `(b, h, ·, ·)` of `k` into `out` (length [`panel_len`]).
pub fn pack_keys<E: KvElem>(k: &View4<E>, b: usize, h: usize, w: usize, out: &mut [f32]) {
    let [_, _, lk, dk] = k.dims();
    let pw = 2 * w;
    for (p, panel) in out.chunks_exact_mut(pw * dk).enumerate() {
        for c in 0..pw {
            let j = p * pw + c;
            if j < lk {
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
