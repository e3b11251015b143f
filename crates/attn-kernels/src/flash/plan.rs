//! How one call is cut into work ([`Plan`]), chosen from its sizes unless [`Tuning`] forces it:
//! - the path: **decode** (keys read in place, every query head of a group stacked into one job
//!   per `(b, kvh)`) when a group's query rows, `Hq/Hkv · Lq`, are at most [`DECODE_ROWS`];
//!   **prefill** otherwise, one job per `(b, h, block of queries)` of [`BLOCK_ROWS`] rows, or
//!   [`BLOCK_ROWS_STREAMING`] when a head's keys and values outgrow half of this CPU's L2
//!   (`cache::caches`); under a block mask, [`SPARSE_ROWS`] or [`SPARSE_ROWS_STREAMING`] so that
//!   each job lies inside one of its query blocks;
//! - the packing chunks (prefill): the key/value heads whose packed keys are held at once, as many
//!   as fit in [`PACK_BUDGET`] bytes (decode packs nothing: one chunk of every head);
//! - split-KV: when there are fewer than [`JOBS_PER_THREAD`] jobs per thread, each job's keys are
//!   cut into shards of at least [`MIN_SHARD_KEYS`] keys (never when weights are asked for).

use std::ops::Range;

use super::block::Job;
use super::pack;
use crate::amx::TileChoice;
use crate::output::Path;
use crate::problem::{Dims, Precision};

/// Query rows per prefill job when a head's keys and values fit in half of the L2 cache.
pub const BLOCK_ROWS: usize = 24;
/// Query rows per prefill job otherwise, so each pass over the keys and values from L3 serves
/// more rows.
pub const BLOCK_ROWS_STREAMING: usize = 96;
/// [`BLOCK_ROWS`] under a block mask: a divisor of its query block, so a job sees one list.
pub const SPARSE_ROWS: usize = 32;
/// [`BLOCK_ROWS_STREAMING`] under a block mask.
pub const SPARSE_ROWS_STREAMING: usize = crate::sparse::SPARSE_BLOCK;
const _: () = assert!(crate::sparse::SPARSE_BLOCK.is_multiple_of(SPARSE_ROWS));
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

/// Overrides of the automatic plan, for tests and experiments; `Default` chooses automatically.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// Force a path.
    pub path: Option<Path>,
    /// Force the number of key shards (split-KV); ignored when weights are asked for.
    pub shards: Option<usize>,
    /// Which tiles the forward's bfloat16 products run on (AMX by default where it is ready).
    pub tiles: TileChoice,
}

impl Tuning {
    /// Everything automatic (as `Default`), usable in constants.
    pub const DEFAULT: Tuning = Tuning { path: None, shards: None, tiles: TileChoice::Auto };
}

/// The work of one call.
pub(super) struct Plan {
    /// Whether the decode path runs (else prefill, with packed keys).
    pub(super) decode: bool,
    /// Every job over all keys, in order of `(b, kvh)` and then of the output rows they write.
    pub(super) jobs: Vec<Job>,
    /// Key shards per job; 1 runs each job whole.
    pub(super) shards: usize,
    /// Slots of packed operands per key/value head (`pack::head_len`).
    pub(super) panel_len: usize,
    /// Key/value heads packed at once.
    pub(super) heads_per_chunk: usize,
}

impl Plan {
    /// The plan for sizes `d` with key panels of `2·w` keys on `threads` threads.
    /// With `sparse` (a block mask), prefill jobs lie inside one of its query blocks; `compute`
    /// sets what a head's packing holds.
    pub(super) fn new(
        d: &Dims,
        w: usize,
        want_weights: bool,
        sparse: bool,
        compute: Precision,
        tuning: Tuning,
        threads: usize,
    ) -> Plan {
        let decode = match tuning.path {
            Some(p) => p == Path::Decode,
            None => decodes(d),
        };
        let jobs = jobs(d, decode, sparse);
        let shards = match tuning.shards {
            _ if want_weights || jobs.is_empty() || d.lk == 0 => 1,
            Some(n) => n.max(1),
            None => (JOBS_PER_THREAD * threads).div_ceil(jobs.len()).min(d.lk / MIN_SHARD_KEYS).max(1),
        };
        let panel_len = pack::head_len(d, w, compute);
        let heads_per_chunk =
            if decode { d.b * d.hkv } else { (PACK_BUDGET / panel_len.saturating_mul(4).max(1)).max(1) };
        Plan { decode, jobs, shards, panel_len, heads_per_chunk }
    }

    /// The jobs in runs whose key/value heads are packed together.
    pub(super) fn chunks(&self, hkv: usize) -> impl Iterator<Item = &[Job]> {
        let chunk_of = move |j: &Job| (j.b * hkv + j.kvh) / self.heads_per_chunk;
        self.jobs.chunk_by(move |a, b| chunk_of(a) == chunk_of(b))
    }
}

/// Whether a call of sizes `d` takes the decode path when no path is forced (a path that computes
/// its products in f32 whatever [`Precision`](crate::Precision) asks).
pub fn decodes(d: &Dims) -> bool {
    d.group() * d.lq <= DECODE_ROWS
}

/// Every job of the path over all keys, in order of `(b, kvh)`; with `sparse`, prefill jobs of
/// [`SPARSE_ROWS`] or [`SPARSE_ROWS_STREAMING`] rows, each inside one block mask's query block.
fn jobs(d: &Dims, decode: bool, sparse: bool) -> Vec<Job> {
    let g = d.group();
    let head_bytes = d.lk.saturating_mul(d.dk + d.dv).saturating_mul(4);
    let streaming = head_bytes > super::cache::caches().l2 / 2;
    let block_rows = match (sparse, streaming) {
        (false, false) => BLOCK_ROWS,
        (false, true) => BLOCK_ROWS_STREAMING,
        (true, false) => SPARSE_ROWS,
        (true, true) => SPARSE_ROWS_STREAMING,
    };
    (0..d.b)
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
        .collect()
}

/// The key ranges of about `shards` split-KV shards of `0..lk`, with boundaries at multiples of
/// [`SHARD_ALIGN`] (so possibly fewer ranges than `shards`).
pub(super) fn shard_ranges(lk: usize, shards: usize) -> Vec<Range<usize>> {
    let step = lk.div_ceil(shards).div_ceil(SHARD_ALIGN) * SHARD_ALIGN;
    (0..lk).step_by(step).map(|s| s..(s + step).min(lk)).collect()
}
