//! The scan for keys and values holding a non-finite number, whose products must be skipped
//! rather than multiplied by zero (a masked key's NaN must reach no output): per tile, the masked
//! columns whose value row is not finite ([`bad_columns`], from the call's list when it made one,
//! [`nonfinite_rows`], else by scanning the tile's rows); and the finiteness test of one row
//! ([`all_finite`]), which also decides whether a backward job may pair keys.

use std::ops::Range;

use rayon::prelude::*;

use super::block::{Work, LDS};
use super::key_tiles::Seg;
use crate::simd::KvElem;
use crate::view::View4;

/// Keys of the tile `segs` outside each segment's clean columns (`w.clean`, as [`scores`] left
/// them) whose value row holds a non-finite number, as `(tile column, key, the block rows for
/// which it is masked)` (read from the scores in `w.s`), in column order: those products must be
/// skipped, not multiplied by zero. `v` is the value head from its first row on, at row stride
/// `ldv`, rows `dv` long; `listed`, when given, its non-finite rows ([`nonfinite_rows`]), which
/// spares the scan of the tile's.
#[inline(always)]
pub(super) fn bad_columns<E: KvElem>(
    v: &[E],
    ldv: usize,
    dv: usize,
    segs: &[Seg],
    listed: Option<&[usize]>,
    w: &Work,
    rows: usize,
) -> Vec<BadColumn> {
    let mut out = Vec::new();
    for (sg, clean) in segs.iter().zip(&w.clean) {
        let (j0, n) = (sg.j0, sg.n);
        let columns: Vec<usize> = match listed {
            Some(keys) => {
                let from = keys.partition_point(|&j| j < j0);
                keys[from..]
                    .iter()
                    .take_while(|&&j| j < j0 + n)
                    .map(|&j| j - j0)
                    .filter(|c| !clean.contains(c))
                    .collect()
            }
            // A value row of `Dv = 0` is empty (so finite) whatever its stride.
            None => (0..clean.start)
                .chain(clean.end..n)
                .filter(|&c| dv > 0 && !all_finite(&v[(j0 + c) * ldv..][..dv]))
                .collect(),
        };
        out.extend(columns.into_iter().map(|c| {
            let col = sg.col + c;
            (col, j0 + c, (0..rows).map(|r| w.s[r * LDS + col] == f32::NEG_INFINITY).collect())
        }));
    }
    out
}

/// A tile column whose value row is not finite: `(tile column, key, whether each block row masks
/// it)`.
pub(super) type BadColumn = (usize, usize, Vec<bool>);

/// The keys of each key/value head of `v: [B, Hkv, Lk, Dv]` in `heads` (indices `b·Hkv + kvh`)
/// whose value row holds a non-finite number, sorted, one list per head at `b·Hkv + kvh` (empty
/// for the heads outside `heads`).
pub(super) fn nonfinite_rows<E: KvElem>(v: &View4<E>, heads: Range<usize>) -> Vec<Vec<usize>> {
    let [b, h, l, _] = v.dims();
    (0..b * h)
        .into_par_iter()
        .map(|bh| {
            if !heads.contains(&bh) {
                return Vec::new();
            }
            (0..l).filter(|&j| !all_finite(v.row(bh / h, bh % h, j))).collect()
        })
        .collect()
}

/// Whether every element is finite: `x·0` is 0 for finite `x` and NaN otherwise, summed in
/// independent lanes so the loop vectorises.
#[inline(always)]
pub(in crate::flash) fn all_finite<E: KvElem>(row: &[E]) -> bool {
    let mut acc = [0.0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder().iter().fold(0.0, |a, x| a + x.to_f32() * 0.0);
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x.to_f32() * 0.0;
        }
    }
    (acc.iter().sum::<f32>() + tail) == 0.0
}
