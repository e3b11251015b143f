//! The paged cache's kernel ([`paged_attention`], whose semantics `crate::paged` states): each
//! task is one sequence, a block of its query rows (all heads', `[Hq, Lq]` in order) and a shard
//! of its keys, run through the online softmax a chunk of [`CHUNK`] keys at a time, key/value head
//! by head within a chunk. A task reads its pages' rows of every head it serves, so its reads are
//! whole runs of memory (one head's rows lie `Hkv·D` apart, a task per head read a memory page
//! for each key). A chunk's key and value rows of a head are gathered into two small f32 buffers (widened
//! from f16/bf16 with the SIMD layer, dequantized from q8_0/e4m3), so one instantiation of the
//! decode path's micro-kernels (`decode_scores`, `pv_block`) serves every storage and page size;
//! the buffers stay in L1, so the cache itself is read once. Shards are sized so that a call has
//! a few tasks per thread, and merged by their log-sum-exps; sinks are joined once at the end.

use rayon::prelude::*;

use super::forward::accumulate::pv_block;
use super::micro::Fma;
use super::scores::decode_scores;
use crate::alloc;
use crate::error::{AttnError, Result};
use crate::lse::lse_parts;
use crate::mask::{Align, Band};
use crate::merge::{fold_sinks, merge_row};
use crate::paged::{fp8_decode, layout, Layout, PagedKv, PagedParams, Pages, Q8_BLOCK};
use crate::simd::{self, KvElem, Simd, SimdJob, Target};
use crate::view::View4;

/// Keys per chunk: the scores of a block's rows and the chunk's rows stay in L1.
const CHUNK: usize = 64;
/// Query rows per task at most (a chunk's scores `[ROWS, CHUNK]` are 16 KiB).
const ROWS: usize = 64;
/// Fewest keys per shard: below it a shard's merge and setup outweigh its keys.
const MIN_SHARD: usize = 512;

/// `out: [B, Hq, Lq, Dv]` and `lse: [B, Hq, Lq]` (natural log; −∞, or the sink, for a row with
/// no key) of the queries `q: [B, Hq, Lq, Dk]` against the paged cache `cache`, as
/// [`crate::paged`] describes. Every problem with the inputs is a typed error naming its field;
/// nothing is read out of bounds.
pub fn paged_attention(
    q: &View4<f32>,
    cache: &PagedKv,
    p: &PagedParams,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let lay = layout(q, cache, p)?;
    let rows_all = lay.b * lay.hq * lay.lq;
    if out.len() != rows_all * cache.dv {
        return Err(AttnError::Output { tensor: "out", expected: rows_all * cache.dv, found: out.len() });
    }
    if lse.len() != rows_all {
        return Err(AttnError::Output { tensor: "lse", expected: rows_all, found: lse.len() });
    }
    let seq_rows = lay.hq * lay.lq;
    let band = |s: usize| Band::new(p.causal, p.window, Align::BottomRight, lay.lq, lay.lens[s]);
    // The groups (sequence, block of its rows) and the keys any of their rows sees.
    let mut groups = Vec::new();
    for s in 0..lay.b {
        for r0 in (0..seq_rows).step_by(ROWS) {
            let nr = ROWS.min(seq_rows - r0);
            let (lo, hi) = (r0..r0 + nr)
                .map(|r| band(s).keys(r % lay.lq, lay.lens[s]))
                .filter(|(a, b)| a < b)
                .fold((usize::MAX, 0), |(a, b), (x, y)| (a.min(x), b.max(y)));
            groups.push(Group { s, r0, nr, keys: lo.min(hi)..hi });
        }
    }
    let total: usize = groups.iter().map(|g| g.keys.len()).sum();
    let per = total.div_ceil(4 * rayon::current_num_threads()).max(MIN_SHARD).div_ceil(CHUNK) * CHUNK;
    let mut tasks = Vec::new();
    for (x, g) in groups.iter().enumerate() {
        let mut j = g.keys.start;
        loop {
            let end = (j + per).min(g.keys.end);
            tasks.push(Task { group: x, keys: j..end });
            j = end;
            if j >= g.keys.end {
                break;
            }
        }
    }
    let dv = cache.dv;
    let part_rows: usize = tasks.iter().map(|t| groups[t.group].nr).sum();
    let mut po = alloc::filled("paged partial outputs", &[part_rows, dv], 0.0f32)?;
    let mut pl = alloc::filled("paged partial log-sum-exps", &[part_rows, 2], f32::NEG_INFINITY)?;
    let scale = p.scale.unwrap_or(1.0 / (cache.dk as f64).sqrt()) as f32;
    let cx = Cx { q, cache, lay: &lay, scale, softcap: p.softcap.map(|c| c as f32), band: &band };
    let mut work: Vec<(&Task, &mut [f32], &mut [f32])> = Vec::with_capacity(tasks.len());
    let (mut ro, mut rl) = (&mut po[..], &mut pl[..]);
    for t in &tasks {
        let nr = groups[t.group].nr;
        let (o, rest) = std::mem::take(&mut ro).split_at_mut(nr * dv);
        let (l, rest_l) = std::mem::take(&mut rl).split_at_mut(nr * 2);
        (ro, rl) = (rest, rest_l);
        work.push((t, o, l));
    }
    let target = Target::best();
    work.into_par_iter().for_each_init(Scratch::default, |w, (t, o, l)| {
        target.run(TaskJob { cx: &cx, g: &groups[t.group], keys: t.keys.clone(), w, o, l })
    });
    // Merge each group's shards into its rows of `out`.
    let mut at = 0;
    let mut x = 0;
    while x < tasks.len() {
        let g = &groups[tasks[x].group];
        let n = tasks[x..].iter().take_while(|t| t.group == tasks[x].group).count();
        let base = g.s * seq_rows + g.r0;
        for r in 0..g.nr {
            let parts = (0..n).map(|y| {
                let off = at + y * g.nr + r;
                (pl[2 * off], pl[2 * off + 1], &po[off * dv..(off + 1) * dv])
            });
            let row = base + r;
            (lse[row], _) = merge_row(parts, &mut out[row * dv..(row + 1) * dv]);
        }
        at += n * g.nr;
        x += n;
    }
    if let Some(sinks) = p.sinks {
        fold_sinks(sinks, lay.lq, dv, out, lse)?;
    }
    Ok(())
}

/// One sequence's block of query rows `r0..r0 + nr` (row `r` is query head `r / Lq`, query
/// `r % Lq`), with the keys any of them sees.
struct Group {
    s: usize,
    r0: usize,
    nr: usize,
    keys: std::ops::Range<usize>,
}

/// A shard of a group's keys.
struct Task {
    group: usize,
    keys: std::ops::Range<usize>,
}

/// What every task reads.
struct Cx<'a, B> {
    q: &'a View4<'a, f32>,
    cache: &'a PagedKv<'a>,
    lay: &'a Layout,
    scale: f32,
    softcap: Option<f32>,
    band: &'a B,
}

/// A worker's buffers, reused from task to task.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    s: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    range: Vec<(usize, usize)>,
    /// Each key of the chunk in flight: the row of its first head in the pages.
    slots: Vec<usize>,
}

/// One task on the call's instruction set: its rows' normalised outputs `o: [nr, Dv]` and
/// `(lse, residue)` pairs `l: [nr, 2]` over its keys.
struct TaskJob<'a, B> {
    cx: &'a Cx<'a, B>,
    g: &'a Group,
    keys: std::ops::Range<usize>,
    w: &'a mut Scratch,
    o: &'a mut [f32],
    l: &'a mut [f32],
}

impl<B: Fn(usize) -> Band + Sync> SimdJob for TaskJob<'_, B> {
    type Out = ();
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let TaskJob { cx, g, keys, w, o, l } = self;
        let c = cx.cache;
        let (dk, dv, nr, lq) = (c.dk, c.dv, g.nr, cx.lay.lq);
        let group = cx.lay.hq / c.heads;
        let len = cx.lay.lens[g.s];
        let band = (cx.band)(g.s);
        let width = CHUNK.div_ceil(S::W) * S::W;
        w.q.clear();
        w.range.clear();
        for r in g.r0..g.r0 + nr {
            let (h, i) = (r / lq, r % lq);
            w.q.extend_from_slice(cx.q.row(g.s, h, i));
            let (lo, hi) = band.keys(i, len);
            w.range.push((lo.max(keys.start), hi.min(keys.end)));
        }
        // The key/value heads the block's rows use, and each one's rows in the block.
        let heads = g.r0 / lq / group..(g.r0 + nr - 1) / lq / group + 1;
        let (h0, nh) = (heads.start, heads.len());
        for (v, n) in [(&mut w.s, nr * width), (&mut w.k, nh * CHUNK * dk), (&mut w.v, nh * CHUNK * dv)] {
            v.resize(n, 0.0);
        }
        w.m.clear();
        w.m.resize(nr, f32::NEG_INFINITY);
        w.l.clear();
        w.l.resize(nr, 0.0);
        o.fill(0.0);
        let rows_of_head = |kvh: usize| {
            let (a, b) = (kvh * group * lq, (kvh + 1) * group * lq);
            a.max(g.r0) - g.r0..b.min(g.r0 + nr) - g.r0
        };
        let max_pages = cx.lay.max_pages;
        let table = &c.block_table[g.s * max_pages..][..max_pages];
        // Row of key `j`'s first head in the pages.
        let slot = |j: usize| (table[j / c.page_size] as usize * c.page_size + j % c.page_size) * c.heads;
        for j0 in keys.clone().step_by(CHUNK) {
            let n = CHUNK.min(keys.end - j0);
            w.slots.clear();
            w.slots.extend((j0..j0 + n).map(slot));
            // The next chunk's rows asked for now: its pages lie anywhere, where no hardware
            // prefetcher follows.
            for j in j0 + n..keys.end.min(j0 + n + CHUNK) {
                let r = slot(j) + h0;
                c.k.prefetch(r..r + nh, dk);
                c.v.prefetch(r..r + nh, dv);
            }
            // Keys of every head the block uses gathered slot by slot: each slot's heads are one run
            // of memory, so the reads stream.
            for (x, &r) in w.slots.iter().enumerate() {
                for y in 0..nh {
                    // SAFETY: the CPU has `S` (the caller's contract); rows were checked in bounds.
                    unsafe { widen::<S>(&c.k, r + h0 + y, c.heads, dk, &mut w.k[(y * CHUNK + x) * dk..][..dk]) };
                }
            }
            let mut seen = [false; ROWS];
            for kvh in heads.clone() {
                let rows = rows_of_head(kvh);
                let kh = w.k[(kvh - h0) * CHUNK * dk..].as_ptr();
                let (qh, sh) = (w.q[rows.start * dk..].as_ptr(), w.s[rows.start * width..].as_mut_ptr());
                // SAFETY: the CPU has `S`; `w.q` holds the head's rows of `dk`, `kh` `n` rows, `w.s`
                // the head's rows of `width ≥ n`.
                unsafe { decode_scores::<S, f32>(qh, dk, kh, dk, n, dk, cx.scale, rows.len(), sh, width) };
                for r in rows.clone() {
                    let srow = &mut w.s[r * width..][..width];
                    let (lo, hi) = w.range[r];
                    let (a, b) = (lo.clamp(j0, j0 + n) - j0, hi.clamp(j0, j0 + n) - j0);
                    srow[..a].fill(f32::NEG_INFINITY);
                    srow[b.max(a)..].fill(f32::NEG_INFINITY);
                    seen[kvh - h0] |= a < b;
                    // SAFETY: the CPU has `S`; the row holds `width`, a multiple of `S::W`, floats.
                    unsafe {
                        softmax_row::<S>(
                            srow,
                            a..b.max(a),
                            cx.softcap,
                            &mut w.m[r],
                            &mut w.l[r],
                            &mut o[r * dv..][..dv],
                        )
                    };
                }
            }
            for (x, &r) in w.slots.iter().enumerate() {
                for y in (0..nh).filter(|&y| seen[y]) {
                    // SAFETY: as for the keys.
                    unsafe { widen::<S>(&c.v, r + h0 + y, c.heads, dv, &mut w.v[(y * CHUNK + x) * dv..][..dv]) };
                }
            }
            for kvh in heads.clone().filter(|&h| seen[h - h0]) {
                let rows = rows_of_head(kvh);
                let vh = w.v[(kvh - h0) * CHUNK * dv..].as_ptr();
                let (ph, oh) = (w.s[rows.start * width..].as_ptr(), o[rows.start * dv..].as_mut_ptr());
                // SAFETY: the CPU has `S`; `w.s` holds the head's rows of `n` probabilities at
                // stride `width`, `vh` `n` rows of `dv`, `o` the head's rows of `dv`.
                unsafe { pv_block::<S, Fma, f32>(ph, width, 1, vh, dv, n, oh, dv, rows.len()) };
            }
        }
        for r in 0..nr {
            let (m, sum) = (w.m[r], w.l[r]);
            if m == f32::NEG_INFINITY {
                (l[2 * r], l[2 * r + 1]) = (f32::NEG_INFINITY, 0.0);
                continue;
            }
            (l[2 * r], l[2 * r + 1]) = lse_parts(m, sum);
            o[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x /= sum);
        }
    }
}

/// One row's online-softmax step over a chunk: the scores `s` (their allowed columns `cols`, the
/// rest already −∞) soft-capped, the running maximum `m` raised, the denominator `l` and the
/// output row `o` rescaled, and `s` replaced by the probabilities against the new maximum.
///
/// # Safety
/// The CPU has `S`'s instruction set; `s.len()` is a multiple of `S::W`.
#[inline(always)]
unsafe fn softmax_row<S: Simd>(
    s: &mut [f32],
    cols: std::ops::Range<usize>,
    cap: Option<f32>,
    m: &mut f32,
    l: &mut f32,
    o: &mut [f32],
) {
    if let Some(cap) = cap {
        // Only the allowed columns: the others stay −∞ (tanh would make them −cap).
        for x in &mut s[cols.clone()] {
            *x = cap * (*x / cap).tanh();
        }
    }
    let mx = s[cols].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let new = m.max(mx);
    if new == f32::NEG_INFINITY {
        s.fill(0.0);
        return;
    }
    if *m != new {
        let corr = (*m - new).exp();
        *l *= corr;
        o.iter_mut().for_each(|x| *x *= corr);
        *m = new;
    }
    // SAFETY: the CPU has `S`; whole vectors of `s` (its length is a multiple of `S::W`).
    unsafe {
        let mut sum = S::splat(0.0);
        let (nv, one) = (S::splat(new), S::splat(1.0));
        for c in (0..s.len()).step_by(S::W) {
            let p = s.as_mut_ptr().add(c);
            let e = simd::exp::<S>(S::fnma(one, nv, S::load(p)));
            S::store(p, e);
            sum = S::add(sum, e);
        }
        *l += S::reduce_sum(sum);
    }
}

/// Row `r` of `pages` (`d` elements) as f32 in `out`: f32/f16/bf16 widened and q8_0/e4m3
/// decoded with `S`'s vectors (to the values `Pages::widen_row` gives, which the oracle reads).
///
/// # Safety
/// The CPU has `S`'s instruction set; row `r` exists in `pages` (`PagedKv::check`).
#[inline(always)]
unsafe fn widen<S: Simd>(pages: &Pages, r: usize, heads: usize, d: usize, out: &mut [f32]) {
    // SAFETY: the CPU has `S`; the row's `d` elements exist and `out` holds `d`.
    unsafe {
        match pages {
            Pages::F32(x) => out.copy_from_slice(&x[r * d..][..d]),
            Pages::F16(x) => widen_elems::<S, _>(&x[r * d..][..d], out),
            Pages::Bf16(x) => widen_elems::<S, _>(&x[r * d..][..d], out),
            Pages::Q8 { values, scales } => {
                // `d` is a multiple of the block (`PagedKv::check`), and the block of every `S::W`.
                let nb = d / Q8_BLOCK;
                for (b, scale) in scales[r * nb..][..nb].iter().enumerate() {
                    let (src, dst) = (values[r * d + b * Q8_BLOCK..].as_ptr(), out[b * Q8_BLOCK..].as_mut_ptr());
                    let sv = S::splat(scale.to_f32());
                    for c in (0..Q8_BLOCK).step_by(S::W) {
                        S::store(dst.add(c), S::mul(S::load_i8(src.add(c)), sv));
                    }
                }
            }
            Pages::Fp8 { values, scales } => {
                let (src, scale) = (&values[r * d..][..d], scales[r % heads]);
                let (whole, sv) = (d / S::W * S::W, S::splat(scale));
                for c in (0..whole).step_by(S::W) {
                    S::store(out.as_mut_ptr().add(c), S::mul(S::load_fp8(src.as_ptr().add(c)), sv));
                }
                for (o, &b) in out[whole..].iter_mut().zip(&src[whole..]) {
                    *o = fp8_decode(b) * scale;
                }
            }
        }
    }
}

/// `out = src` widened, a vector at a time, then a scalar tail.
///
/// # Safety
/// The CPU has `S`'s instruction set; `out` holds `src.len()` floats.
#[inline(always)]
unsafe fn widen_elems<S: Simd, E: KvElem>(src: &[E], out: &mut [f32]) {
    let whole = src.len() / S::W * S::W;
    // SAFETY: vectors stop at `whole ≤ len` (the caller's contract for `S`).
    unsafe {
        for c in (0..whole).step_by(S::W) {
            S::store(out.as_mut_ptr().add(c), E::load::<S>(src.as_ptr().add(c)));
        }
    }
    for (o, x) in out[whole..].iter_mut().zip(&src[whole..]) {
        *o = x.to_f32();
    }
}
