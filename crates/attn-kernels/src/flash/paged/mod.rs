//! The paged cache's kernel ([`paged_attention`], whose semantics `crate::paged` states): each
//! task is one sequence, a block of its query rows (all heads', `[Hq, Lq]` in order) and a shard
//! of its keys, run through the online softmax a chunk of [`CHUNK`] keys at a time, key/value head
//! by head within a chunk. A task reads its pages' rows of every head it serves, so its reads are
//! whole runs of memory (one head's rows lie `Hkv·D` apart, a task per head read a memory page
//! for each key). The decode path's micro-kernels (`decode_scores`, `pv_block`) read f32, f16 and bf16 pages in
//! place, a run of keys that follow each other in memory (a page's slots, consecutive pages) per
//! call; q8_0 and e4m3 rows (and caches whose keys and values differ in storage) are dequantized a
//! chunk at a time into two f32 buffers, read the same way. Shards are sized so that a call has
//! a few tasks per thread, and merged by their log-sum-exps; sinks are joined once at the end.
//!
//! - [`chunk`]: one chunk of a task — scores, online softmax, values — and the rows' widening.

mod chunk;

use rayon::prelude::*;

use crate::alloc;
use crate::error::{AttnError, Result};
use crate::lse::lse_parts;
use crate::mask::{Align, Band};
use crate::merge::{fold_sinks, merge_row};
use crate::paged::{layout, Layout, PagedKv, PagedParams, Pages};
use crate::simd::{Isa, KvElem, Simd, SimdJob, Target};
use crate::view::View4;
use chunk::{chunk, Block, Rows, Run};

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
    // Half-precision pages are read in place on the x86 instruction sets only: the portable
    // micro-kernels are compiled for f32 (`KvElem::ON_PORTABLE`).
    let x86 = Isa::best() != Isa::Portable;
    match (cache.k, cache.v) {
        (Pages::F32(k), Pages::F32(v)) => run_tasks(work, &groups, &cx, Place::Pages(k, v)),
        (Pages::F16(k), Pages::F16(v)) if x86 => run_tasks(work, &groups, &cx, Place::Pages(k, v)),
        (Pages::Bf16(k), Pages::Bf16(v)) if x86 => run_tasks(work, &groups, &cx, Place::Pages(k, v)),
        _ => run_tasks::<_, f32>(work, &groups, &cx, Place::Widened),
    }
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

/// Runs every task of `work` (with its rows of the partial outputs and log-sum-exps) on the
/// threads, reading the pages as `place` says.
fn run_tasks<B: Fn(usize) -> Band + Sync, E: KvElem>(
    work: Vec<(&Task, &mut [f32], &mut [f32])>,
    groups: &[Group],
    cx: &Cx<B>,
    place: Place<E>,
) {
    let target = Target::best();
    work.into_par_iter().for_each_init(Scratch::default, |w, (t, o, l)| {
        target.run(TaskJob { cx, g: &groups[t.group], keys: t.keys.clone(), place, w, o, l })
    });
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
    /// The chunk's runs of keys whose rows follow each other at one stride.
    runs: Vec<Run>,
}

/// Where a task reads a chunk's key and value rows.
#[derive(Clone, Copy)]
enum Place<'a, E> {
    /// In place in the key and value pages, stored as `E`.
    Pages(&'a [E], &'a [E]),
    /// Widened (dequantized) into the worker's f32 buffers, head by head (the job's `E` is `f32`).
    Widened,
}

/// One task on the call's instruction set: its rows' normalised outputs `o: [nr, Dv]` and
/// `(lse, residue)` pairs `l: [nr, 2]` over its keys.
struct TaskJob<'a, B, E> {
    cx: &'a Cx<'a, B>,
    g: &'a Group,
    keys: std::ops::Range<usize>,
    place: Place<'a, E>,
    w: &'a mut Scratch,
    o: &'a mut [f32],
    l: &'a mut [f32],
}

impl<B: Fn(usize) -> Band + Sync, E: KvElem> SimdJob for TaskJob<'_, B, E> {
    type Out = ();
    const ON_PORTABLE: bool = E::ON_PORTABLE;
    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        let TaskJob { cx, g, keys, place, w, o, l } = self;
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
        let max_pages = cx.lay.max_pages;
        let table = &c.block_table[g.s * max_pages..][..max_pages];
        // Row of key `j`'s first head in the pages.
        let slot = |j: usize| (table[j / c.page_size] as usize * c.page_size + j % c.page_size) * c.heads;
        let blk = |j0: usize, n: usize| Block {
            j0,
            n,
            heads: heads.clone(),
            cache_heads: c.heads,
            dk,
            dv,
            width,
            scale: cx.scale,
            softcap: cx.softcap,
            group,
            lq,
            r0: g.r0,
            nr,
        };
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
            w.runs.clear();
            match place {
                Place::Pages(kp, vp) => {
                    // Keys whose slots follow each other (a page's, or consecutive pages').
                    let mut x = 0;
                    while x < n {
                        let run = w.slots[x..].iter().enumerate().take_while(|&(y, &r)| r == w.slots[x] + y * c.heads);
                        let len = run.count();
                        w.runs.push(Run { x0: x, n: len, row: w.slots[x] + h0 });
                        x += len;
                    }
                    let at = |base, d| Rows { base, d, key_rows: c.heads, head_rows: 1 };
                    // SAFETY: the CPU has `S`; every run's rows of the block's heads exist in the
                    // pages (`PagedKv::check`).
                    unsafe { chunk::<S, E>(&blk(j0, n), w, o, at(kp.as_ptr(), dk), at(vp.as_ptr(), dv), None) };
                }
                Place::Widened => {
                    w.runs.push(Run { x0: 0, n, row: 0 });
                    let at = |base, d| Rows { base, d, key_rows: 1, head_rows: CHUNK };
                    let (kb, vb) = (w.k.as_ptr(), w.v.as_ptr());
                    // SAFETY: the CPU has `S`; the buffers hold `nh` heads' `CHUNK` rows, widened
                    // from rows that exist in the pages before they are read.
                    unsafe { chunk::<S, f32>(&blk(j0, n), w, o, at(kb, dk), at(vb, dv), Some((&c.k, &c.v))) };
                }
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
