//! One block of query rows through the whole online softmax: the key tiles in the block's range,
//! each scored, masked, exponentiated and multiplied into the output, then normalised; and, when
//! weights are asked for, a second sweep that writes the normalised probabilities.
//!
//! A block is `nh` query heads of one key/value head group × `ni` consecutive queries (decode
//! stacks all heads of a group so each key/value row is read once for all of them). Scores stay in
//! natural units and are scaled after the dot product, like the formula; the exponential is taken
//! as `exp2((s − m)·log2 e)` so its argument is rounded relative to `s − m`, not to `s`. Tiles
//! outside every row's band are never visited; tiles crossing a row's band edge are masked
//! element-wise; element masks are applied to every tile: the soft-cap and a stride-1 bias with
//! vectors, a keep row with one byte search when it allows the whole tile.

use std::f32::consts::LOG2_E;
use std::ops::Range;

use super::micro::{pv, pv_scalar, qk_panel, qk_rows};
use super::simd::{tanh, KvElem, Simd};
use crate::problem::Problem;
use crate::view::View4;

/// Floats of packed keys per prefill tile (`keys × Dk`), sized so a tile stays in L1 with the
/// values and scores it meets; keys per tile are a multiple of every ISA's panel width (32).
pub const TILE_FLOATS: usize = 8192;
/// Keys per tile in the decode path.
pub const DECODE_TILE_KEYS: usize = 256;
/// The most keys a tile holds, in either path.
const MAX_TILE_KEYS: usize = 256;
const _: () = assert!(DECODE_TILE_KEYS <= MAX_TILE_KEYS);
/// Row stride of the score block: the most keys a tile holds rounded up by two vectors of the
/// widest ISA. A constant, so the micro-kernels address each row at a fixed offset rather than
/// spending integer instructions (on the vector ports) on `r · stride`.
const LDS: usize = MAX_TILE_KEYS + 32;

/// What every block of a call shares.
pub struct Ctx<'a, E> {
    /// The validated call.
    pub pb: &'a Problem<'a, f32>,
    /// `q: [B, Hq, Lq, Dk]`.
    pub q: View4<'a, f32>,
    /// `k: [B, Hkv, Lk, Dk]`.
    pub k: View4<'a, E>,
    /// `v: [B, Hkv, Lk, Dv]`.
    pub v: View4<'a, E>,
}

/// One unit of work: rows `(h0 + r / ni, i0 + r % ni)` of batch `b` over keys `keys`.
#[derive(Debug, Clone)]
pub struct Job {
    /// Batch.
    pub b: usize,
    /// Key/value head.
    pub kvh: usize,
    /// First query head.
    pub h0: usize,
    /// Query heads stacked.
    pub nh: usize,
    /// First query.
    pub i0: usize,
    /// Queries per head.
    pub ni: usize,
    /// Key range (the whole `0..Lk` unless split).
    pub keys: Range<usize>,
}

impl Job {
    /// Rows in the block.
    pub fn rows(&self) -> usize {
        self.nh * self.ni
    }
    fn head_query(&self, r: usize) -> (usize, usize) {
        (self.h0 + r / self.ni, self.i0 + r % self.ni)
    }
}

/// A block's outputs: `o: [rows, Dv]` (zeroed), `lse: [rows]`, `weights: [rows, Lk]` (zeroed).
pub struct Outs<'o> {
    /// Output rows.
    pub o: &'o mut [f32],
    /// Log-sum-exp per row (natural log).
    pub lse: &'o mut [f32],
    /// Weights rows, when asked for.
    pub weights: Option<&'o mut [f32]>,
}

/// Rows per `qk_panel` call and per `pv` call for the vector width `W`.
pub(super) fn rows_per_call<S: Simd>() -> (usize, usize) {
    if S::W == 16 {
        (12, 6)
    } else {
        (4, 3)
    }
}

macro_rules! with_rows {
    ($n:expr, $f:ident :: <$($g:ty),*; $($c:literal),*> ($($arg:expr),*)) => {
        match $n {
            1 => $f::<$($g,)* 1 $(, $c)*>($($arg),*),
            2 => $f::<$($g,)* 2 $(, $c)*>($($arg),*),
            3 => $f::<$($g,)* 3 $(, $c)*>($($arg),*),
            4 => $f::<$($g,)* 4 $(, $c)*>($($arg),*),
            5 => $f::<$($g,)* 5 $(, $c)*>($($arg),*),
            6 => $f::<$($g,)* 6 $(, $c)*>($($arg),*),
            7 => $f::<$($g,)* 7 $(, $c)*>($($arg),*),
            8 => $f::<$($g,)* 8 $(, $c)*>($($arg),*),
            9 => $f::<$($g,)* 9 $(, $c)*>($($arg),*),
            10 => $f::<$($g,)* 10 $(, $c)*>($($arg),*),
            11 => $f::<$($g,)* 11 $(, $c)*>($($arg),*),
            12 => $f::<$($g,)* 12 $(, $c)*>($($arg),*),
            _ => unreachable!("row chunks are 1 to 12"),
        }
    };
}
pub(super) use with_rows;

/// Per-block working memory, reused from job to job by each worker.
#[derive(Default)]
pub struct Work {
    /// Queries: `[rows, Dk]` in the decode path; in the prefill path each chunk of `R` rows
    /// that one `qk_panel` call takes is stored transposed, `[Dk, R]`.
    q: Vec<f32>,
    /// Scores / probabilities `[rows, LDS]`.
    s: Vec<f32>,
    /// Running maximum per row.
    m: Vec<f32>,
    /// Running denominator per row.
    l: Vec<f32>,
    /// Allowed key range per row.
    range: Vec<(usize, usize)>,
}

impl Work {
    fn reset(&mut self, rows: usize, dk: usize) {
        let fill = |v: &mut Vec<f32>, n, x| {
            v.clear();
            v.resize(n, x);
        };
        // Queries and scores are written before they are read: only grow them.
        for (v, n) in [(&mut self.q, rows * dk), (&mut self.s, rows * LDS)] {
            if v.len() < n {
                v.resize(n, 0.0);
            }
        }
        fill(&mut self.m, rows, f32::NEG_INFINITY);
        fill(&mut self.l, rows, 0.0);
        self.range.clear();
    }
}

/// Runs one block; `panels` holds the packed keys of the block's head in the prefill path.
///
/// # Safety
/// Must run on a CPU supporting `S`'s instruction set; `panels`, when given, is the packing of
/// this block's `(b, kvh)` by `pack_keys` for `S::W`.
#[inline(always)]
pub unsafe fn run<S: Simd, E: KvElem>(cx: &Ctx<E>, panels: Option<&[f32]>, job: &Job, outs: Outs, w: &mut Work) {
    let pb = cx.pb;
    let d = pb.dims;
    let rows = job.rows();
    let tile = if panels.is_some() {
        (TILE_FLOATS / d.dk.max(1)).clamp(32, MAX_TILE_KEYS) / 32 * 32
    } else {
        DECODE_TILE_KEYS
    };
    w.reset(rows, d.dk);
    let (rq, _) = rows_per_call::<S>();
    for r in 0..rows {
        let (h, i) = job.head_query(r);
        let q = cx.q.row(job.b, h, i);
        if panels.is_some() {
            let r0 = r / rq * rq;
            let nr = rq.min(rows - r0);
            for (k, &x) in q.iter().enumerate() {
                w.q[r0 * d.dk + k * nr + r - r0] = x;
            }
        } else {
            w.q[r * d.dk..(r + 1) * d.dk].copy_from_slice(q);
        }
        let (lo, hi) = pb.key_range(job.b, i);
        w.range.push((lo.max(job.keys.start), hi.min(job.keys.end)));
    }
    let lo = w.range.iter().filter(|r| r.0 < r.1).map(|r| r.0).min();
    let hi = w.range.iter().map(|r| r.1).max().unwrap_or(0);
    outs.lse.fill(f32::NEG_INFINITY);
    let Some(lo) = lo else { return };
    let start = if panels.is_some() { lo / (2 * S::W) * (2 * S::W) } else { lo };
    let (kbase, ldk) = head_ptr(&cx.k, job.b, job.kvh);
    let (vbase, ldv) = head_ptr(&cx.v, job.b, job.kvh);

    // Key tiles `j0..j0+n` covering `start..hi`.
    let tiles = || (start..hi).step_by(tile).map(|j0| (j0, tile.min(hi - j0)));
    for (j0, n) in tiles() {
        // SAFETY: forwarded from the caller; tiles stay within `0..Lk`.
        let masked = unsafe { scores::<S, E>(cx, panels, job, w, kbase, ldk, j0, n) };
        let bad = masked.map_or_else(Vec::new, |clean| bad_columns(vbase, ldv, d.dv, j0, n, clean, w, rows));
        // SAFETY: as above.
        unsafe { softmax_update::<S>(cx, job, w, outs.o, j0, n) };
        // SAFETY: as above; `vbase` rows `j0..j0+n` exist.
        unsafe { accumulate::<S, E>(w, rows, vbase.add(j0 * ldv), ldv, n, d.dv, outs.o, &bad) };
    }
    for r in 0..rows {
        let (m, l) = (w.m[r], w.l[r]);
        if m == f32::NEG_INFINITY {
            continue;
        }
        outs.lse[r] = m + l.ln();
        let inv = 1.0 / l;
        outs.o[r * d.dv..(r + 1) * d.dv].iter_mut().for_each(|x| *x *= inv);
    }
    if let Some(wt) = outs.weights {
        for (j0, n) in tiles() {
            // SAFETY: as above.
            unsafe {
                scores::<S, E>(cx, panels, job, w, kbase, ldk, j0, n);
                write_weights::<S>(w, rows, j0, n, d.lk, wt);
            }
        }
    }
}

/// Base pointer of head `(b, h)` and its row stride.
pub(super) fn head_ptr<E>(t: &View4<E>, b: usize, h: usize) -> (*const E, usize) {
    let s = t.strides();
    (t.data()[b * s[0] + h * s[1]..].as_ptr(), s[2])
}

/// Scaled (and soft-capped, biased) scores of every row against keys `j0..j0+n`, masked (−∞) where
/// not allowed; columns from `n` up to the vector-padded width are −∞. Returns `None` when no key
/// of the tile was masked for any row, else the columns that no row masks (empty when an element
/// mask masked something; between the rows' band edges otherwise).
///
/// # Safety
/// CPU supports `S`; `kbase` rows `j0..j0+n` exist; `panels` as for [`run`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores<S: Simd, E: KvElem>(
    cx: &Ctx<E>,
    panels: Option<&[f32]>,
    job: &Job,
    w: &mut Work,
    kbase: *const E,
    ldk: usize,
    j0: usize,
    n: usize,
) -> Option<Range<usize>> {
    let pb = cx.pb;
    let dk = pb.dims.dk;
    let rows = job.rows();
    let (rq, _) = rows_per_call::<S>();
    let qp = w.q.as_ptr();
    let scale = pb.scale as f32;
    let sp = w.s.as_mut_ptr();
    let width;
    // SAFETY: `w.q` holds `rows·dk`, `w.s` holds `rows·LDS` with `LDS >= n` rounded up to 2·W;
    // panels hold every panel of keys `< Lk`, and `kbase` rows up to `j0 + n`.
    unsafe {
        match panels {
            Some(p) => {
                let pw = 2 * S::W;
                let np = n.div_ceil(pw);
                width = np * pw;
                for pi in 0..np {
                    let kp = p.as_ptr().add((j0 / pw + pi) * dk * pw);
                    let mut r0 = 0;
                    while r0 < rows {
                        let nr = rq.min(rows - r0);
                        with_rows!(nr, qk_panel::<S; >(qp.add(r0 * dk), kp, dk, scale, sp.add(r0 * LDS + pi * pw), LDS));
                        r0 += nr;
                    }
                }
            }
            None => {
                width = n.div_ceil(S::W) * S::W;
                let mut r0 = 0;
                while r0 < rows {
                    let nr = 4.min(rows - r0);
                    with_rows!(
                        nr,
                        qk_rows::<S, E; >(qp.add(r0 * dk), dk, kbase.add(j0 * ldk), ldk, n, dk, scale, sp.add(r0 * LDS), LDS)
                    );
                    r0 += nr;
                }
            }
        }
    }
    let mut masked = false;
    let mut clean = 0..n;
    let b = job.b;
    for r in 0..rows {
        let (h, i) = job.head_query(r);
        let row = &mut w.s[r * LDS..r * LDS + width];
        if let Some(cap) = pb.softcap {
            // SAFETY: `row` holds `width`, a multiple of `S::W`.
            unsafe { softcap_row::<S>(row, cap as f32) };
        }
        row[n..].fill(f32::NEG_INFINITY);
        let row = &mut row[..n];
        if let Some(bias) = pb.elem.bias {
            let (bv, st) = bias.row(b, h, i);
            // SAFETY: CPU supports `S` (forwarded from the caller).
            if unsafe { add_bias::<S>(row, bv, st, j0) } {
                (masked, clean) = (true, 0..0);
            }
        }
        if let Some(keep) = pb.elem.keep {
            let (kv, st) = keep.row(b, h, i);
            if apply_keep(row, kv, st, j0) {
                (masked, clean) = (true, 0..0);
            }
        }
        let (lo, hi) = w.range[r];
        let (a, z) = (lo.clamp(j0, j0 + n) - j0, hi.clamp(j0, j0 + n) - j0);
        if a > 0 || z < n || lo >= hi {
            masked = true;
            if lo >= hi {
                row.fill(f32::NEG_INFINITY);
                clean = 0..0;
            } else {
                row[..a].fill(f32::NEG_INFINITY);
                row[z..].fill(f32::NEG_INFINITY);
                clean = clean.start.max(a)..clean.end.min(z);
            }
        }
    }
    masked.then(|| clean.start..clean.end.max(clean.start))
}

/// Adds the bias row `bv` (keys `j0..`; stride `st` along keys, 1, or 0 when broadcast, as every
/// [`crate::Broadcast`] row has) to the scores `row`; a bias of −∞ masks its key whatever the
/// score (NaN and +∞ included). Returns whether any key of the tile was masked so.
///
/// # Safety
/// CPU supports `S`.
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
    // SAFETY: the loop reads and writes whole vectors inside `row` and `bv` (both `row.len()` long).
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

/// Sets the scores of keys the keep row `kv` (keys `j0..`; stride `st` as for [`add_bias`])
/// forbids to −∞; returns whether any was. A tile whose keys are all kept costs one byte search.
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

/// `row[c] = cap · tanh(row[c] / cap)` in place (length a multiple of `S::W`).
#[inline(always)]
pub(super) unsafe fn softcap_row<S: Simd>(row: &mut [f32], cap: f32) {
    // SAFETY: the loop reads and writes whole vectors inside `row`.
    unsafe {
        let c = S::splat(cap);
        for i in (0..row.len()).step_by(S::W) {
            let p = row.as_mut_ptr().add(i);
            S::store(p, S::mul(c, tanh::<S>(S::div(S::load(p), c))));
        }
    }
}

/// Keys of the tile outside `clean` (the columns no row masks) whose value row holds a non-finite
/// number, with the rows for which each is masked: those products must be skipped, not multiplied
/// by zero.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bad_columns<E: KvElem>(
    vbase: *const E,
    ldv: usize,
    dv: usize,
    j0: usize,
    n: usize,
    clean: Range<usize>,
    w: &Work,
    rows: usize,
) -> Vec<(usize, Vec<bool>)> {
    (0..clean.start)
        .chain(clean.end..n)
        .filter(|&c| {
            // SAFETY: rows `j0..j0+n` of the value head exist, each `dv` long.
            let row = unsafe { std::slice::from_raw_parts(vbase.add((j0 + c) * ldv), dv) };
            !all_finite(row)
        })
        .map(|c| (c, (0..rows).map(|r| w.s[r * LDS + c] == f32::NEG_INFINITY).collect()))
        .collect()
}

/// Whether every element is finite: `x·0` is 0 for finite `x` and NaN otherwise, summed in
/// independent lanes so the loop vectorises.
#[inline(always)]
pub(super) fn all_finite<E: KvElem>(row: &[E]) -> bool {
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

/// Online-softmax step for one tile: new running maxima, rescaled outputs and denominators, and
/// the tile's probabilities `exp(s − m)` in place of the scores (dropout applied after the
/// denominator is updated).
///
/// # Safety
/// CPU supports `S`.
#[inline(always)]
unsafe fn softmax_update<S: Simd>(cx: &Ctx<impl KvElem>, job: &Job, w: &mut Work, o: &mut [f32], j0: usize, n: usize) {
    let pb = cx.pb;
    let dv = pb.dims.dv;
    let width = n.div_ceil(S::W) * S::W;
    for r in 0..job.rows() {
        let row = &mut w.s[r * LDS..r * LDS + width];
        // SAFETY: `row` holds `width`, a multiple of `S::W`.
        let tmax = unsafe { row_max::<S>(row) };
        let mut m_new = w.m[r].max(tmax);
        // The vector maximum skips NaN; a NaN score must still poison its row, as in the reference.
        if w.m[r].is_nan() || (m_new == f32::NEG_INFINITY && row[..n].iter().any(|x| x.is_nan())) {
            m_new = f32::NAN;
        }
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            continue;
        }
        let alpha = if w.m[r] == m_new { 1.0 } else { (w.m[r] - m_new).exp() };
        // SAFETY: as above.
        let sum = unsafe { exp_row::<S>(row, m_new) };
        w.l[r] = w.l[r] * alpha + sum;
        w.m[r] = m_new;
        if alpha != 1.0 {
            o[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= alpha);
        }
        if let Some(dr) = pb.dropout {
            let (h, i) = job.head_query(r);
            let key = dr.row_key(job.b, h, i, [pb.dims.hq, pb.dims.lq]);
            let sc = dr.scale();
            for (c, p) in row[..n].iter_mut().enumerate() {
                *p = if dr.keeps(key, j0 + c) { *p * sc } else { 0.0 };
            }
        }
    }
}

/// Largest element of `row` (length a multiple of `S::W`).
#[inline(always)]
unsafe fn row_max<S: Simd>(row: &[f32]) -> f32 {
    // SAFETY: the loop reads whole vectors inside `row`.
    unsafe {
        let mut m = S::splat(f32::NEG_INFINITY);
        for c in (0..row.len()).step_by(S::W) {
            m = S::max(S::load(row.as_ptr().add(c)), m);
        }
        S::reduce_max(m)
    }
}

/// `row[c] = exp(row[c] − m)`, computed as `exp2((row[c] − m)·log2 e)`, in place; returns the sum.
#[inline(always)]
pub(super) unsafe fn exp_row<S: Simd>(row: &mut [f32], m: f32) -> f32 {
    // SAFETY: the loop reads and writes whole vectors inside `row`.
    unsafe {
        let neg = S::splat(-m);
        let log2e = S::splat(LOG2_E);
        let mut acc = S::splat(0.0);
        for c in (0..row.len()).step_by(S::W) {
            let p = S::exp2(S::mul(S::add(S::load(row.as_ptr().add(c)), neg), log2e));
            S::store(row.as_mut_ptr().add(c), p);
            acc = S::add(acc, p);
        }
        S::reduce_sum(acc)
    }
}

/// `O += P · V` for the tile; value rows listed in `bad` (non-finite) are added one product at a
/// time, skipping the rows that mask them.
///
/// # Safety
/// CPU supports `S`; `v` valid for `n` rows of `dv` elements with stride `ldv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate<S: Simd, E: KvElem>(
    w: &Work,
    rows: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    dv: usize,
    o: &mut [f32],
    bad: &[(usize, Vec<bool>)],
) {
    let p = w.s.as_ptr();
    let op = o.as_mut_ptr();
    let mut c = 0;
    for run_end in bad.iter().map(|b| b.0).chain(std::iter::once(n)) {
        if run_end > c {
            // SAFETY: columns `c..run_end` of P and rows of V exist.
            unsafe { pv_block::<S, E>(p.add(c), LDS, 1, v.add(c * ldv), ldv, run_end - c, op, dv, rows) };
        }
        c = run_end + 1;
    }
    for (c, masked) in bad {
        // SAFETY: row `c` of V exists with `dv` elements.
        let vrow = unsafe { std::slice::from_raw_parts(v.add(c * ldv), dv) };
        for r in (0..rows).filter(|&r| !masked[r]) {
            let pr = w.s[r * LDS + c];
            for (x, y) in o[r * dv..(r + 1) * dv].iter_mut().zip(vrow) {
                *x += pr * y.to_f32();
            }
        }
    }
}

/// `O[rows, dv] += P[rows, n] · V[n, dv]` (`P[r][j]` at `p[r·ldp + j·ldj]`) with the vector
/// micro-kernel and scalar column tail.
///
/// # Safety
/// As for [`accumulate`]; `o` valid for `rows` rows of `dv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pv_block<S: Simd, E: KvElem>(
    p: *const f32,
    ldp: usize,
    ldj: usize,
    v: *const E,
    ldv: usize,
    n: usize,
    o: *mut f32,
    dv: usize,
    rows: usize,
) {
    let (_, rp) = rows_per_call::<S>();
    let mut r0 = 0;
    // SAFETY: every call stays within `rows` rows and `dv` columns.
    unsafe {
        while r0 < rows {
            let nr = rp.min(rows - r0);
            let (pr, or) = (p.add(r0 * ldp), o.add(r0 * dv));
            let mut c0 = 0;
            while c0 + 4 * S::W <= dv {
                with_rows!(nr, pv::<S, E; 4>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += 4 * S::W;
            }
            while c0 + S::W <= dv {
                with_rows!(nr, pv::<S, E; 1>(pr, ldp, ldj, v, ldv, n, or, dv, c0));
                c0 += S::W;
            }
            if c0 < dv {
                pv_scalar(pr, ldp, ldj, v, ldv, n, or, dv, nr, c0..dv);
            }
            r0 += nr;
        }
    }
}

/// Writes `exp(s − m) / l` of the tile into the weights rows `[rows, lk]`.
///
/// # Safety
/// CPU supports `S`.
#[inline(always)]
unsafe fn write_weights<S: Simd>(w: &Work, rows: usize, j0: usize, n: usize, lk: usize, wt: &mut [f32]) {
    let width = n.div_ceil(S::W) * S::W;
    let mut buf = vec![0.0f32; width];
    for r in 0..rows {
        if w.m[r] == f32::NEG_INFINITY {
            continue;
        }
        buf.copy_from_slice(&w.s[r * LDS..r * LDS + width]);
        // SAFETY: `buf` holds `width`, a multiple of `S::W`.
        unsafe { exp_row::<S>(&mut buf, w.m[r]) };
        let inv = 1.0 / w.l[r];
        let scores = &w.s[r * LDS..];
        for ((x, &p), &s) in wt[r * lk + j0..r * lk + j0 + n].iter_mut().zip(&buf).zip(scores) {
            *x = if s == f32::NEG_INFINITY { 0.0 } else { p * inv };
        }
    }
}
