//! The fast forward kernel: tiled online softmax ("flash attention") in f32 with every semantic
//! of the reference, O(tile) extra memory per thread (plus the packed keys of the heads in
//! flight), and work spread over rayon's threads.
//!
//! How a call is cut into work:
//! - **prefill** (a group's query rows, `Hq/Hkv · Lq`, exceed [`DECODE_ROWS`]): one job per
//!   `(b, h, block of queries)` ([`BLOCK_ROWS`], or [`BLOCK_ROWS_STREAMING`] when a head's keys
//!   and values outgrow L2); keys are packed into panels once per key/value head
//!   (`pack`), in chunks of heads bounded by [`PACK_BUDGET`] bytes;
//! - **decode** (few query rows): one job per `(b, kvh)` stacking every query head of the group,
//!   so each key/value row is read once for all of them, straight from the caller's layout in
//!   f32, f16 or bf16;
//! - **split-KV**: when jobs are too few to keep every thread busy, each job's keys are cut into
//!   shards computed independently and merged through their log-sum-exps ([`crate::merge`]).
//!
//! The micro-kernels (`micro`) are written once over `simd::Simd` and instantiated for
//! AVX-512F, AVX2+FMA+F16C and portable Rust; the entry points below carry the matching
//! `#[target_feature]` and are only called after [`Isa::is_available`].

mod block;
mod micro;
mod pack;
mod simd;
mod workspace;

use rayon::prelude::*;

use crate::isa::Isa;
use crate::merge::merge_row;
use crate::problem::Problem;
use crate::reference::AttnOutput;
use crate::view::View4;
use block::{Ctx, Job, Outs, Work};
use simd::KvElem;

/// Query rows per prefill job when a head's keys and values fit in half of a 2 MiB L2 cache.
pub const BLOCK_ROWS: usize = 24;
/// Query rows per prefill job otherwise, so each pass over the keys and values from L3 serves
/// more rows.
pub const BLOCK_ROWS_STREAMING: usize = 96;
/// Bytes of one head's keys and values above which blocks grow to [`BLOCK_ROWS_STREAMING`].
const L2_HALF: usize = 1 << 20;
/// At most this many stacked query rows per key/value head use the decode path.
pub const DECODE_ROWS: usize = 16;
/// Bytes of packed keys held at once.
pub const PACK_BUDGET: usize = 16 << 20;
/// Fewest keys in a split-KV shard.
pub const MIN_SHARD_KEYS: usize = 512;
/// Shard boundaries are multiples of this (a multiple of every ISA's key panel).
const SHARD_ALIGN: usize = 32;
/// Jobs per thread below which keys are split.
const JOBS_PER_THREAD: usize = 4;

type BlockFn<E> = unsafe fn(&Ctx<E>, Option<&[f32]>, &Job, Outs, &mut Work);

/// How the work of a call is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Packed keys, blocks of one head's queries.
    Prefill,
    /// Keys read in place, every query head of a group stacked.
    Decode,
}

/// Overrides of the automatic plan, for tests and experiments; `Default` chooses automatically.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Force a path.
    pub path: Option<Path>,
    /// Force the number of key shards (split-KV); ignored when weights are asked for.
    pub shards: Option<usize>,
}

/// Flash attention with instruction set `isa` (which must be available). `q: [B, Hq, Lq, Dk]`,
/// `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`, validated into `pb`; returns `out`, `lse` and,
/// with `want_weights`, the weights `[B, Hq, Lq, Lk]`.
pub(crate) fn forward<E: KvElem>(
    isa: Isa,
    q: &View4<f32>,
    k: &View4<E>,
    v: &View4<E>,
    pb: &Problem<f32>,
    want_weights: bool,
    tuning: Tuning,
) -> AttnOutput<f32> {
    assert!(isa.is_available(), "flash kernel entered without {isa:?} support");
    let (run, w): (BlockFn<E>, usize) = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => (entry::avx512::<E>, 16),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => (entry::avx2::<E>, 8),
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx512 | Isa::Avx2 => unreachable!("x86 instruction sets are never available here"),
        Isa::Portable => (entry::portable::<E>, 8),
    };
    let cx = Ctx { pb, q: *q, k: *k, v: *v };
    let d = pb.dims;
    let mut out = vec![0.0f32; d.out_len()];
    let mut lse = vec![f32::NEG_INFINITY; d.lse_len()];
    let mut weights = want_weights.then(|| vec![0.0f32; d.weights_len()]);
    if d.out_len() == 0 && d.lse_len() == 0 {
        return AttnOutput { out, lse, weights };
    }
    let g = d.group();
    let decode = match tuning.path {
        Some(p) => p == Path::Decode,
        None => g * d.lq <= DECODE_ROWS,
    };
    let block_rows = if d.lk * (d.dk + d.dv) * 4 > L2_HALF { BLOCK_ROWS_STREAMING } else { BLOCK_ROWS };
    let jobs: Vec<Job> = (0..d.b)
        .flat_map(|b| (0..d.hkv).map(move |kvh| (b, kvh)))
        .flat_map(|(b, kvh)| -> Vec<Job> {
            if decode {
                vec![Job { b, kvh, h0: kvh * g, nh: g, i0: 0, ni: d.lq, keys: 0..d.lk }]
            } else {
                (kvh * g..(kvh + 1) * g)
                    .flat_map(|h| (0..d.lq).step_by(block_rows).map(move |i0| (h, i0)))
                    .map(|(h, i0)| Job { b, kvh, h0: h, nh: 1, i0, ni: block_rows.min(d.lq - i0), keys: 0..d.lk })
                    .collect()
            }
        })
        .collect();
    let threads = rayon::current_num_threads();
    let shards = match tuning.shards {
        _ if want_weights || jobs.is_empty() || d.lk == 0 => 1,
        Some(n) => n.max(1),
        None => (JOBS_PER_THREAD * threads).div_ceil(jobs.len()).min(d.lk / MIN_SHARD_KEYS).max(1),
    };
    let plen = pack::panel_len(d.lk, d.dk, w);
    let heads_per_chunk = if decode { d.b * d.hkv } else { (PACK_BUDGET / (plen * 4).max(1)).max(1) };
    let mut outs = Rest { o: &mut out, lse: &mut lse, w: weights.as_deref_mut() };
    for chunk in
        jobs.chunk_by(|a, b| (a.b * d.hkv + a.kvh) / heads_per_chunk == (b.b * d.hkv + b.kvh) / heads_per_chunk)
    {
        let first = chunk[0].b * d.hkv + chunk[0].kvh;
        let mut panels = workspace::take(if decode { 0 } else { plen * heads_per_chunk.min(d.b * d.hkv - first) });
        panels.par_chunks_mut(plen.max(1)).enumerate().for_each(|(x, p)| {
            let hh = first + x;
            pack::pack_keys(k, hh / d.hkv, hh % d.hkv, w, p);
        });
        let panels_of = |job: &Job| (!decode).then(|| &panels[(job.b * d.hkv + job.kvh - first) * plen..][..plen]);
        let chunk_outs: Vec<(Job, Outs)> = chunk.iter().map(|j| (j.clone(), outs.take(j.rows(), d.dv, d.lk))).collect();
        if shards == 1 {
            chunk_outs.into_par_iter().for_each_init(Work::default, |w, (job, o)| {
                // SAFETY: `isa` is available (asserted above); panels belong to the job's head.
                unsafe { run(&cx, panels_of(&job), &job, o, w) }
            });
        } else {
            run_split(&cx, run, &panels_of, chunk_outs, shards, d.lk, d.dv);
        }
        workspace::give(panels);
    }
    AttnOutput { out, lse, weights }
}

/// Runs each job as `shards` key ranges into temporary partials, then merges them.
fn run_split<'p, E: KvElem>(
    cx: &Ctx<E>,
    run: BlockFn<E>,
    panels_of: &(dyn Fn(&Job) -> Option<&'p [f32]> + Sync),
    jobs: Vec<(Job, Outs)>,
    shards: usize,
    lk: usize,
    dv: usize,
) {
    let step = lk.div_ceil(shards).div_ceil(SHARD_ALIGN) * SHARD_ALIGN;
    let rows: usize = jobs.iter().map(|(j, _)| j.rows()).sum();
    let ranges: Vec<_> = (0..lk).step_by(step).map(|s| s..(s + step).min(lk)).collect();
    let mut po = vec![0.0f32; ranges.len() * rows * dv];
    let mut pl = vec![f32::NEG_INFINITY; ranges.len() * rows];
    let mut rest = Rest { o: &mut po, lse: &mut pl, w: None };
    let mut tasks = Vec::new();
    for r in &ranges {
        for (j, _) in &jobs {
            tasks.push((Job { keys: r.clone(), ..j.clone() }, rest.take(j.rows(), dv, 0)));
        }
    }
    tasks.into_par_iter().for_each_init(Work::default, |w, (job, o)| {
        // SAFETY: as in `forward`.
        unsafe { run(cx, panels_of(&job), &job, o, w) }
    });
    let mut offsets = Vec::with_capacity(jobs.len());
    jobs.iter().fold(0, |acc, (j, _)| {
        offsets.push(acc);
        acc + j.rows()
    });
    jobs.into_par_iter().zip(offsets).for_each(|((job, o), off)| {
        for r in 0..job.rows() {
            let parts = (0..ranges.len()).map(|s| {
                let row = s * rows + off + r;
                (pl[row], &po[row * dv..(row + 1) * dv])
            });
            merge_row(parts, &mut o.o[r * dv..(r + 1) * dv], &mut o.lse[r]);
        }
    });
}

/// The not yet handed out tail of the output buffers.
struct Rest<'o> {
    o: &'o mut [f32],
    lse: &'o mut [f32],
    w: Option<&'o mut [f32]>,
}

impl<'o> Rest<'o> {
    /// Hands out the next `rows` rows.
    fn take(&mut self, rows: usize, dv: usize, lk: usize) -> Outs<'o> {
        let (o, ro) = std::mem::take(&mut self.o).split_at_mut(rows * dv);
        let (l, rl) = std::mem::take(&mut self.lse).split_at_mut(rows);
        self.o = ro;
        self.lse = rl;
        let weights = self.w.take().map(|w| {
            let (a, b) = w.split_at_mut(rows * lk);
            self.w = Some(b);
            a
        });
        Outs { o, lse: l, weights }
    }
}

/// The per-ISA entry points: each compiles the whole block (inlined) for its instruction set.
mod entry {
    use super::block::{run, Ctx, Job, Outs, Work};
    use super::simd::{KvElem, Portable};

    /// # Safety
    /// The CPU supports AVX-512F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512<E: KvElem>(cx: &Ctx<E>, p: Option<&[f32]>, job: &Job, o: Outs, w: &mut Work) {
        // SAFETY: forwarded from the caller.
        unsafe { run::<super::simd::Avx512, E>(cx, p, job, o, w) }
    }

    /// # Safety
    /// The CPU supports AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn avx2<E: KvElem>(cx: &Ctx<E>, p: Option<&[f32]>, job: &Job, o: Outs, w: &mut Work) {
        // SAFETY: forwarded from the caller.
        unsafe { run::<super::simd::Avx2, E>(cx, p, job, o, w) }
    }

    /// # Safety
    /// None beyond `run`'s pointer contracts, which `forward` upholds.
    pub unsafe fn portable<E: KvElem>(cx: &Ctx<E>, p: Option<&[f32]>, job: &Job, o: Outs, w: &mut Work) {
        // SAFETY: forwarded from the caller.
        unsafe { run::<Portable, E>(cx, p, job, o, w) }
    }
}
