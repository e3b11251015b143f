//! The fused backward kernel (FlashAttention-2's scheme on the CPU): the probabilities are
//! recomputed tile by tile from the forward's log-sum-exp, `Δ_i = dO_i·O_i` is taken once per
//! row and job (with the rounding of the micro-kernel's `dO·v`, so a row that sees one key gets
//! `dS = 0` exactly, as the exact gradient; in `f64` for a head with a sink, where that row's `dS`
//! is not 0), and no `Lq × Lk` buffer ever exists. Extra memory per
//! thread: O(tile), `Δ` of the job's rows, and its queries and output gradients transposed (at most
//! 8 MiB, else tile by tile); when the keys are split (below), one `dq` partial per shard.
//!
//! How the work is cut, and why it is race-free:
//! - a **job** owns one key/value head `(b, kvh)` and a set of key blocks ([`KEY_BLOCK`] keys
//!   each). For each of its blocks it sweeps every query row of every query head of the group
//!   that can see the block (band edges found by binary search, so tiles outside a causal or
//!   window band are never visited), accumulating that block's `dK`, `dV` in thread-local
//!   registers-and-L1 buffers, then writes them once: no two jobs own the same key, so `dk`/`dv`
//!   need no synchronisation, and grouped-query heads are summed inside the job;
//! - `dQ` rows receive a contribution from every key block. With one job per key/value head
//!   (enough heads to keep every thread busy) the job writes `dq` directly. With few heads
//!   (`B·Hkv = 1` included) the key blocks are dealt round-robin to `S` shards (round-robin keeps
//!   causal shards balanced), each shard accumulates into its own `dq` partial, and the partials
//!   are summed afterwards — all cores stay busy even for one head;
//! - `dbias` (only when asked for) may be shared by many jobs through broadcasting, so each tile
//!   adds its `dS` under one lock (an `O(tile)` addition after `O(tile · D)` of arithmetic); so
//!   does the score modification's table gradient `dtable`, from a per-tile buffer.
//!
//! Gradients arriving at the log-sum-exp and the weights ([`SideGrads`]) change two things: each
//! row's term becomes `Δ_i + ω_i − dlse_i` (taken once per row with `Δ`), and a tile adds the
//! weights' gradient to its `dP` after dropout's replay.
//!
//! Attention sinks need nothing of the jobs: the forward's log-sum-exp and output include the
//! sink, so `P = exp(S − lse)` and `Δ = dO·O` are already those of the softmax with the sink, and
//! `dsinks` is one pass over the rows afterwards ([`sinks`]).

mod job;
mod rows;
mod sinks;

use std::cell::RefCell;
use std::sync::Mutex;

use rayon::prelude::*;

use super::plan;
use crate::alloc::{self, AllocError};
use crate::amx::{TileChoice, TileUnit};
use crate::disjoint::Disjoint;
use crate::grad::{AttnGrads, Saved, SideGrads};
use crate::output::Path;
use crate::problem::{Precision, Problem};
use crate::simd::{Isa, Simd, SimdJob, Target};
use crate::view::View4;
use job::{run_job, BwdWork};

/// Keys per block: a multiple of every ISA's key panel (`2·W` ≤ 32), and a block mask's key block.
pub const KEY_BLOCK: usize = 64;
const _: () = assert!(KEY_BLOCK == crate::sparse::SPARSE_BLOCK, "a key block is one block mask column");
/// Query rows per tile: a multiple of every ISA's rows per micro-kernel call (12 on AVX-512, 6
/// on AVX2), at most a block mask's 64. 60 rather than 48: each tile's fixed work (its band, the
/// products' passes over the block's `dK`, `dV` accumulators) over more rows, and a key block's
/// short last tile rarer (see docs/performance-log.md, "attn-kernels/src/flash/backward/mod.rs:
/// TILE_ROWS").
pub const BWD_TILE_ROWS: usize = 60;
/// Query rows per tile under a block mask: one query block, so that a listed block is one tile,
/// never cut into a full tile and a short one nor widened into its unlisted neighbours.
pub const BWD_SPARSE_TILE_ROWS: usize = crate::sparse::SPARSE_BLOCK;
/// The most query rows of any tile.
const BWD_MAX_TILE_ROWS: usize =
    if BWD_TILE_ROWS > BWD_SPARSE_TILE_ROWS { BWD_TILE_ROWS } else { BWD_SPARSE_TILE_ROWS };
/// Jobs per thread wanted before the keys are split into shards.
const JOBS_PER_THREAD: usize = 4;
/// Most bytes of `dq` partials when the keys are split.
const DQ_PARTIAL_BUDGET: usize = 64 << 20;

thread_local! {
    /// This thread's job buffers, kept from job to job and from call to call: a backward called
    /// again and again (every layer of every training step, every sequence of a packed call)
    /// makes them once per thread instead of once per rayon split of every call (`BwdWork::trim`
    /// bounds what stays).
    static WORK: RefCell<BwdWork> = RefCell::new(BwdWork::default());
}

/// What every job of a call shares.
pub(super) struct BwdCtx<'a> {
    pub pb: &'a Problem<'a, f32>,
    pub q: View4<'a, f32>,
    pub k: View4<'a, f32>,
    pub v: View4<'a, f32>,
    pub dout: View4<'a, f32>,
    pub lse: &'a [f32],
    /// The rounding residue of each `lse`, when given.
    pub lse_residue: Option<&'a [f32]>,
    /// The forward's output, for `Δ_i = dO_i·O_i`.
    pub out: View4<'a, f32>,
    /// Gradients arriving at the log-sum-exp and the weights: they join `Δ` and `dP`.
    pub side: SideGrads<'a, f32>,
    /// `dq` (one shard) or its partials `[S][B·Hkv][Hq/Hkv · Lq · Dk]`.
    pub dq: Disjoint<'a>,
    pub dk: Disjoint<'a>,
    pub dv: Disjoint<'a>,
    pub dbias: Option<Mutex<&'a mut [f32]>>,
    /// The score modification's table gradient, when it reads a table.
    pub dtable: Option<Mutex<&'a mut [f32]>>,
    /// Key shards per key/value head.
    pub shards: usize,
    /// Forced transposition plan ([`BackwardTuning::whole_heads`]).
    pub whole_heads: Option<bool>,
    /// Whether the forward scored the keys with the decode path's `qk_rows` (else the prefill
    /// path's `qk_panel`): the backward scores them the same way, so `S` is bit for bit the
    /// forward's and `P = exp(S − lse)` matches its log-sum-exp. A score rounded differently by
    /// one ulp of `|S|` shifts a whole row's `P` by that much relative (`|S|·ε`, several ulp).
    pub decode_scores: bool,
    /// The tiles of the bfloat16 products `S`, `dV`, `dK` and `dQ`, if any (`amx_products`).
    pub tiles: Option<TileUnit>,
}

/// One job: key/value head `(b, kvh)`, key blocks `shard, shard + S, shard + 2S, …`.
#[derive(Debug, Clone, Copy)]
pub(super) struct BwdJob {
    pub b: usize,
    pub kvh: usize,
    pub shard: usize,
}

/// Overrides of the backward's automatic plan, for tests and experiments; `Default` chooses
/// automatically.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackwardTuning {
    /// Force the number of key shards per key/value head (each with its own `dq` partial).
    pub shards: Option<usize>,
    /// Force transposing each job's queries and output gradients once for all its key blocks
    /// (`true`) or tile by tile (`false`).
    pub whole_heads: Option<bool>,
    /// Which tiles the bfloat16 products `S = Q·Kᵀ`, `dV += P̄ᵀ·dO`, `dK += dXᵀ·Q` and
    /// `dQ += dX·K` run on (AMX by default where it is ready; give the forward's choice, so that
    /// `S` is scored as the forward scored it).
    pub tiles: TileChoice,
}

impl BackwardTuning {
    /// Everything automatic (as `Default`), usable in constants.
    pub const DEFAULT: BackwardTuning = BackwardTuning { shards: None, whole_heads: None, tiles: TileChoice::Auto };
}

/// Gradients with instruction set `isa` (which must be available) of the call validated into
/// `pb`; `saved` was checked against `pb.dims`. Refuses gradients too large to allocate.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    isa: Isa,
    q: &View4<f32>,
    k: &View4<f32>,
    v: &View4<f32>,
    saved: &Saved<f32>,
    pb: &Problem<f32>,
    want_dbias: bool,
    tuning: BackwardTuning,
) -> Result<AttnGrads<f32>, AllocError> {
    let target = Target::new(isa).bf16_products(pb.compute == Precision::Bf16);
    let lanes = target.lanes();
    let d = pb.dims;
    let bias_len = pb.elem.bias.filter(|_| want_dbias).map(|b| b.data.len());
    let mut g = AttnGrads::zeros(&d, bias_len, pb.sinks.is_some(), pb.score_mod.map(|f| f.table.len()))?;
    if let (Some(sinks), Some(ds)) = (pb.sinks, g.dsinks.as_deref_mut()) {
        sinks::sink_grads(sinks, saved, &d, ds);
    }
    if d.b == 0 || d.lq == 0 || d.lk == 0 {
        return Ok(g);
    }
    let units = d.b * d.hkv;
    let head_dq = d.group() * d.lq * d.dk;
    let threads = rayon::current_num_threads();
    let shards = if let Some(n) = tuning.shards {
        n.clamp(1, d.lk.div_ceil(KEY_BLOCK))
    } else if units >= JOBS_PER_THREAD * threads {
        1
    } else {
        (JOBS_PER_THREAD * threads)
            .div_ceil(units)
            .min(d.lk.div_ceil(KEY_BLOCK))
            .min(DQ_PARTIAL_BUDGET / (units * head_dq * 4).max(1))
            .max(1)
    };
    let partial_shape = if shards > 1 { [shards, units, head_dq] } else { [0; 3] };
    let mut partials = alloc::filled("dq partials of key shards", &partial_shape, 0.0f32)?;
    let dq_target: &mut [f32] = if shards > 1 { &mut partials } else { &mut g.dq };
    {
        let decode_scores = saved.forward_path.map_or(plan::decodes(&d), |p| p == Path::Decode);
        let cx = BwdCtx {
            pb,
            q: *q,
            k: *k,
            v: *v,
            dout: saved.dout,
            lse: saved.lse,
            lse_residue: saved.lse_residue,
            out: saved.out,
            side: saved.side,
            dq: Disjoint::new(dq_target),
            dk: Disjoint::new(&mut g.dk),
            dv: Disjoint::new(&mut g.dv),
            dbias: g.dbias.as_deref_mut().map(Mutex::new),
            dtable: g.dtable.as_deref_mut().map(Mutex::new),
            shards,
            whole_heads: tuning.whole_heads,
            decode_scores,
            tiles: super::tile_unit(tuning.tiles, pb.compute, decode_scores, &d, lanes),
        };
        let jobs: Vec<BwdJob> = (0..shards)
            .flat_map(|shard| (0..units).map(move |u| BwdJob { b: u / d.hkv, kvh: u % d.hkv, shard }))
            .collect();
        jobs.into_par_iter().for_each(|job| {
            WORK.with(|kept| {
                // Only a thread re-entering here (a job never waits on rayon) would find its
                // buffers taken; it works in fresh ones rather than failing.
                let mut fresh = BwdWork::default();
                let mut kept = kept.try_borrow_mut();
                let w = kept.as_deref_mut().unwrap_or(&mut fresh);
                target.run(BwdBlock { cx: &cx, job: &job, w });
                w.trim();
            })
        });
    }
    if shards > 1 {
        g.dq.par_chunks_mut(head_dq).enumerate().for_each(|(u, out)| {
            for s in 0..shards {
                let part = &partials[(s * units + u) * head_dq..][..head_dq];
                out.iter_mut().zip(part).for_each(|(o, p)| *o += p);
            }
        });
    }
    Ok(g)
}

/// One job of the backward (`job::run_job`) for the call's instruction set.
struct BwdBlock<'a, 'c> {
    cx: &'a BwdCtx<'c>,
    job: &'a BwdJob,
    w: &'a mut BwdWork,
}

impl SimdJob for BwdBlock<'_, '_> {
    type Out = ();
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the CPU has `S` (the caller's contract); `backward` runs each `(b, kvh, shard)`
        // as one job.
        unsafe { run_job::<S>(self.cx, self.job, self.w) }
    }
}
