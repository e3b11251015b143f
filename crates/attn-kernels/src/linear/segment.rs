//! The chunk-parallel form of causal linear attention, for calls with fewer (batch, head) jobs than
//! threads (one long sequence, one or a few heads): each head's rows are cut into `P` segments of
//! whole chunks that run in parallel, each from the state of the rows before it. The forward in
//! three phases:
//! 1. the key states `S = φ(K)ᵀV: [F, Dv]`, `z = Σ φ(k): [F]` of every segment but the last, in
//!    parallel over blocks (each such segment cut into `m` blocks, so that there are about as many
//!    blocks as threads) — [`key_prefixes`];
//! 2. their exclusive prefix sum over the segments, per head ([`exclusive_scan`]: sequential over
//!    the `P·m` block states, a vanishing share of the work next to the chunks');
//! 3. each segment's chunked recurrence from its prefix state, in parallel over (head, segment).
//!
//! The backward adds the mirror image: the segments' query-side totals `U = φ(Q)ᵀdN`,
//! `w = Σ r φ(q)`, summed from the later segments (an exclusive suffix sum) before the descending
//! pass. The sums are the sequential form's, reassociated. Phase 1 repeats the state products of
//! the segments but the last (`(P − 1)/P` of about a third of the forward's products), which
//! [`Plan::choose`] weighs against the threads the segments keep busy.
//!
//! Non-causal calls ([`Plan::global`]) repeat nothing: the key state summed over key segments
//! ([`key_totals`]), then the query segments in parallel (the backward sums their query-side
//! states too, then runs the key segments).
//!
//! Memory: `P ≤ 4·threads / heads` and `heads·(P − 1)·m < heads·(P − 1) + threads`, so the block
//! and prefix states take `O(threads·(F·Dv + F))`, never a state per chunk.

use std::ops::Range;

use rayon::prelude::*;

use super::chunk::{ahead, spread_on_isa, Keys};
use super::gemm::{gemm, Lhs};
use super::rows::add_rows;
use super::{FeatureMap, LinearDims, LinearParams};
use crate::reference::Real;
use crate::simd::Isa;

/// The share of a chunk's work that phase 1 repeats (its state product `φ(K_c)ᵀV_c`, one of the
/// forward's three `C·F·Dv`-sized products at `C = F = Dv`).
const REPEATED: f64 = 1.0 / 3.0;

/// How the rows of each head are cut: `segs` segments of whole chunks, each segment but the last
/// cut into `parts` blocks for phase 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Rows per head and per chunk.
    l: usize,
    c: usize,
    chunks: usize,
    pub segs: usize,
    pub parts: usize,
}

impl Plan {
    /// The plan for a causal call of `heads` independent jobs of `l` rows on the current rayon
    /// pool: `p.segments` segments when set, else the count [`cost`] finds best; `None` for one
    /// segment (the sequential form).
    pub fn choose(heads: usize, l: usize, p: &LinearParams) -> Option<Plan> {
        if !p.causal {
            return None;
        }
        Self::cut(heads, l, p, REPEATED)
    }

    /// The plans of a non-causal call of `heads` jobs: its `lq` query rows and its `lk` key rows
    /// in as many segments each (nothing is repeated: the key state is summed over the key
    /// segments, the query side's over the query segments); `None` for one segment.
    pub fn global(heads: usize, lq: usize, lk: usize, p: &LinearParams) -> Option<(Plan, Plan)> {
        if p.causal {
            return None;
        }
        let queries = Self::cut(heads, lq, p, 0.0)?;
        let keys = Plan { l: lk, chunks: lk.div_ceil(p.chunk), parts: 1, ..queries };
        (keys.chunks >= queries.segs).then_some((Plan { parts: 1, ..queries }, keys))
    }

    /// `l` rows cut for `heads` jobs whose segments after the first repeat `repeated` of their
    /// work; `None` for one segment.
    fn cut(heads: usize, l: usize, p: &LinearParams, repeated: f64) -> Option<Plan> {
        let chunks = l.div_ceil(p.chunk);
        let threads = rayon::current_num_threads();
        let segs = match p.segments {
            0 => best(heads, threads, chunks, repeated),
            s => s.min(chunks),
        };
        (segs > 1).then(|| Plan { l, c: p.chunk, chunks, segs, parts: parts(heads, threads, segs, chunks) })
    }

    /// One segment of all `l` rows in chunks of `c`: the segmented backward's two passes over a
    /// whole head, for heads whose one-pass key states would be too large.
    pub fn whole(l: usize, c: usize) -> Plan {
        Plan { l, c, chunks: l.div_ceil(c), segs: 1, parts: 1 }
    }

    /// The rows of chunks `lo .. hi`.
    fn chunk_rows(&self, lo: usize, hi: usize) -> Range<usize> {
        lo * self.c..(hi * self.c).min(self.l)
    }

    /// The rows of segment `s`.
    pub fn rows(&self, s: usize) -> Range<usize> {
        self.chunk_rows(s * self.chunks / self.segs, (s + 1) * self.chunks / self.segs)
    }

    /// The rows of block `j` of segment `s`.
    fn block(&self, s: usize, j: usize) -> Range<usize> {
        let (lo, n) = (s * self.chunks / self.segs, (s + 1) * self.chunks / self.segs - s * self.chunks / self.segs);
        self.chunk_rows(lo + j * n / self.parts, lo + (j + 1) * n / self.parts)
    }

    /// The rows of `x: [B, Hq, L, w]` for each job (key/value head, segment), in that order: one
    /// slice per query head of the group of `group`.
    pub fn by_job<'a, T>(&self, x: &'a mut [T], w: usize, group: usize) -> Vec<Vec<&'a mut [T]>> {
        let mut jobs = Vec::new();
        jobs.resize_with(x.len() / (self.l * w * group) * self.segs, Vec::new);
        for (h, s, rows) in self.split(x, w) {
            jobs[h / group * self.segs + s].push(rows);
        }
        jobs
    }

    /// The rows of every segment of every head of `x: [heads, L, w]`, as `(head, segment, rows)`
    /// in that order.
    pub fn split<'a, T>(&self, x: &'a mut [T], w: usize) -> Vec<(usize, usize, &'a mut [T])> {
        let mut out = Vec::new();
        for (h, mut rest) in x.chunks_exact_mut(self.l * w).enumerate() {
            for s in 0..self.segs {
                let (this, tail) = std::mem::take(&mut rest).split_at_mut(self.rows(s).len() * w);
                out.push((h, s, this));
                rest = tail;
            }
        }
        out
    }
}

/// The segment count of least [`cost`] (the fewest among equals), at most `4·threads / heads`.
fn best(heads: usize, threads: usize, chunks: usize, repeated: f64) -> usize {
    let most = chunks.min(4 * threads / heads.max(1)).max(1);
    let cost = |s| cost(heads, threads, s, parts(heads, threads, s, chunks), repeated);
    (2..=most).fold(1, |b, s| if cost(s) < cost(b) { s } else { b })
}

/// Blocks per segment before the last: enough for every thread to have one in phase 1, at most
/// the chunks of the shortest segment.
fn parts(heads: usize, threads: usize, segs: usize, chunks: usize) -> usize {
    if segs < 2 {
        return 1;
    }
    threads.div_ceil(heads * (segs - 1)).clamp(1, (chunks / segs).max(1))
}

/// The time of `heads` jobs in `segs` segments on `threads` threads, in units of one sequential
/// head: rounds of segments plus phase 1's rounds of blocks, each `repeated` of a chunk's work.
fn cost(heads: usize, threads: usize, segs: usize, parts: usize, repeated: f64) -> f64 {
    let rounds = |jobs: usize| jobs.div_ceil(threads) as f64;
    let run = rounds(heads * segs) / segs as f64;
    if segs < 2 {
        return run;
    }
    run + repeated * rounds(heads * (segs - 1) * parts) / (segs * parts) as f64
}

/// `acc += x`.
fn add<T: Real>(acc: &mut [T], x: &[T]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a = *a + b);
}

/// `st = (S, z)` (`[F·Dv + F]`, added to) of the keys in `rows` (chunks of `c` from its start),
/// `fk: [c, F]` scratch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_state<T: Real>(
    isa: Isa,
    map: &FeatureMap,
    d: &LinearDims,
    keys: &Keys<T>,
    rows: Range<usize>,
    c: usize,
    fk: &mut [T],
    st: &mut [T],
) {
    let (f, dv) = (d.f, d.dv);
    let (s, z) = st.split_at_mut(f * dv);
    for t0 in rows.clone().step_by(c) {
        let nk = keys.count(t0, c.min(rows.end - t0));
        if nk == 0 {
            break;
        }
        let fk = &mut fk[..nk * f];
        keys.features(isa, map, t0, nk, fk);
        keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), false);
        gemm(isa, f, dv, nk, Lhs::transposed(fk, f), keys.values(t0), keys.ldv, s, dv);
        keys.prefetch(t0 + c, ahead(&rows, t0 + c, c), true);
        add_rows(z, fk, nk);
    }
}

/// Phases 1 and 2: for every key/value head of `keys` and segment `s`, the state `(S, z)` of the
/// rows before segment `s`: `[keys.len(), P, F·Dv + F]` (`S: [F, Dv]`, then `z`), 0 for `s = 0`.
pub(crate) fn key_prefixes<T: Real>(
    isa: Isa,
    plan: &Plan,
    p: &LinearParams,
    d: &LinearDims,
    keys: &[Keys<T>],
) -> Vec<T> {
    let (width, segs, parts) = (d.f * d.dv + d.f, plan.segs, plan.parts);
    if segs == 1 {
        // One segment ([`Plan::whole`]): it starts from no keys.
        return vec![T::zero(); keys.len() * width];
    }
    let mut blocks = vec![T::zero(); keys.len() * (segs - 1) * parts * width];
    blocks.par_chunks_mut(width).enumerate().for_each_init(
        || vec![T::zero(); p.chunk * d.f],
        |fk, (i, st)| {
            let (kh, s, j) = (i / ((segs - 1) * parts), i / parts % (segs - 1), i % parts);
            let rows = plan.block(s, j);
            spread_on_isa(
                isa,
                #[inline(always)]
                || key_state(isa, p.map, d, &keys[kh], rows, p.chunk, fk, st),
            );
        },
    );
    let mut init = vec![T::zero(); keys.len() * segs * width];
    for (head, sums) in init.chunks_exact_mut(segs * width).zip(blocks.chunks_exact((segs - 1) * parts * width)) {
        for (total, seg) in head.chunks_exact_mut(width).zip(sums.chunks_exact(parts * width)) {
            seg.chunks_exact(width).for_each(|b| add(total, b));
        }
        exclusive_scan(head, width, false);
    }
    init
}

/// The state `(S, z)` of all the keys of every key/value head of `keys`, summed over the
/// segments of `plan` made in parallel: `[keys.len(), F·Dv + F]`.
pub(crate) fn key_totals<T: Real>(isa: Isa, plan: &Plan, p: &LinearParams, d: &LinearDims, keys: &[Keys<T>]) -> Vec<T> {
    let (width, segs) = (d.f * d.dv + d.f, plan.segs);
    let mut parts = vec![T::zero(); keys.len() * segs * width];
    parts.par_chunks_mut(width).enumerate().for_each_init(
        || vec![T::zero(); p.chunk * d.f],
        |fk, (i, st)| {
            spread_on_isa(
                isa,
                #[inline(always)]
                || key_state(isa, p.map, d, &keys[i / segs], plan.rows(i % segs), p.chunk, fk, st),
            )
        },
    );
    let mut total = vec![T::zero(); keys.len() * width];
    for (t, head) in total.chunks_exact_mut(width).zip(parts.chunks_exact(segs * width)) {
        head.chunks_exact(width).for_each(|x| add(t, x));
    }
    total
}

/// `x: [P, width]` (one head's per-segment totals) replaced by their exclusive prefix sums
/// (`x_s ← Σ_{s' < s} x_s'`), or with `suffix` their exclusive suffix sums (`Σ_{s' > s}`).
pub(crate) fn exclusive_scan<T: Real>(x: &mut [T], width: usize, suffix: bool) {
    let mut run = vec![T::zero(); width];
    let mut step = |seg: &mut [T]| {
        seg.iter_mut().zip(run.iter_mut()).for_each(|(a, r)| {
            let total = *a;
            *a = *r;
            *r = *r + total;
        })
    };
    if suffix {
        x.chunks_exact_mut(width).rev().for_each(&mut step);
    } else {
        x.chunks_exact_mut(width).for_each(&mut step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(l: usize, c: usize, segs: usize, parts: usize) -> Plan {
        Plan { l, c, chunks: l.div_ceil(c), segs, parts }
    }

    #[test]
    fn segments_and_blocks_tile_the_rows_on_chunk_boundaries() {
        for (l, c, segs, parts) in [(10, 3, 2, 1), (100, 7, 3, 4), (65, 64, 2, 1), (64 * 9 + 1, 64, 4, 2)] {
            let p = plan(l, c, segs, parts);
            let segments: Vec<_> = (0..segs).map(|s| p.rows(s)).collect();
            assert_eq!(segments[0].start, 0);
            assert_eq!(segments[segs - 1].end, l);
            for s in 0..segs {
                assert!(!segments[s].is_empty() && segments[s].start % c == 0, "{l} {c} {segs}: {segments:?}");
                if s + 1 < segs {
                    assert_eq!(segments[s].end, segments[s + 1].start);
                    let blocks: Vec<_> = (0..parts).map(|j| p.block(s, j)).collect();
                    assert_eq!((blocks[0].start, blocks[parts - 1].end), (segments[s].start, segments[s].end));
                    assert!(blocks.windows(2).all(|b| b[0].end == b[1].start && b[1].start % c == 0));
                }
            }
        }
    }

    #[test]
    fn split_hands_out_each_heads_segments_in_order() {
        let p = plan(5, 2, 3, 1);
        let mut x: Vec<usize> = (0..2 * 5).collect();
        let parts: Vec<_> = p.split(&mut x, 1).into_iter().map(|(h, s, r)| (h, s, r.to_vec())).collect();
        let want = [(0, 0, vec![0, 1]), (0, 1, vec![2, 3]), (0, 2, vec![4]), (1, 0, vec![5, 6])];
        assert_eq!(&parts[..4], &want);
        assert_eq!(parts.len(), 6);
    }

    #[test]
    fn exclusive_scans_leave_each_segment_out() {
        let mut x = vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
        exclusive_scan(&mut x, 2, false);
        assert_eq!(x, [0.0, 0.0, 1.0, 10.0, 3.0, 30.0]);
        let mut x = vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
        exclusive_scan(&mut x, 2, true);
        assert_eq!(x, [5.0, 50.0, 3.0, 30.0, 0.0, 0.0]);
    }

    #[test]
    fn the_cost_model_splits_few_heads_and_leaves_many_alone() {
        let best = |heads, threads, chunks| best(heads, threads, chunks, REPEATED);
        assert_eq!(best(1, 2, 1024), 2);
        assert_eq!(best(8, 2, 1024), 1);
        assert_eq!(best(2, 2, 1024), 1);
        assert_eq!(best(1, 2, 1), 1);
        assert!(best(1, 16, 1024) >= 8);
    }

    #[test]
    fn a_call_with_fewer_heads_than_threads_is_segmented_when_causal() {
        let map = FeatureMap::Elu;
        let causal = LinearParams { causal: true, ..LinearParams::new(&map) };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let plan = pool.install(|| Plan::choose(1, 65536, &causal)).expect("segmented");
        assert_eq!((plan.segs, plan.parts), (2, 2));
        assert_eq!(pool.install(|| Plan::choose(8, 65536, &causal)), None);
        assert_eq!(pool.install(|| Plan::choose(1, 65536, &LinearParams::new(&map))), None);
        // Non-causal: queries and keys in as many segments, keys of their own length (chunks of 64:
        // 16 of queries, 5 of keys).
        let global = LinearParams { chunk: 64, ..LinearParams::new(&map) };
        let (queries, keys) = pool.install(|| Plan::global(1, 1000, 300, &global)).unwrap();
        assert_eq!((queries.segs, keys.segs, queries.rows(1), keys.rows(1)), (2, 2, 512..1000, 128..300));
        // Forced: at most one segment per chunk.
        let forced = LinearParams { segments: 9, ..causal };
        assert_eq!(pool.install(|| Plan::choose(8, 130, &forced)).map(|p| p.segs), Some(3));
    }
}
