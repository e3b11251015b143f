//! The flash kernels' entry, both directions: tiled online softmax ("flash attention") in f32
//! with every semantic of the reference, O(tile) extra memory per thread (plus the packed keys of
//! the heads in flight), and work spread over rayon's threads.
//!
//! `forward` (here) picks the instruction set (`simd::Target`), asks `plan` how to cut the call
//! (prefill or decode path, packing chunks, split-KV shards; the rules are there), packs each
//! chunk's keys (and, with bfloat16 products, values) into panels (`pack`, in a reused
//! `workspace` buffer) and runs the jobs on rayon's threads, whole (`forward::run`, one block of
//! query rows through the online softmax) or as key shards merged through their log-sum-exps
//! (`split`). Attention sinks are joined after every job, once per row
//! (`merge::fold_sink_rows`): the blocks and shards never see them. `backward` (in `backward`)
//! recomputes the scores block by block and accumulates the gradients.
//!
//! The pieces of a block live beside it: the shared block types and tile geometry (`block`), the
//! score tile and its masking (`scores`, shared by every pass that recomputes scores), the
//! micro-kernels (`micro`), written once over `simd::Simd` and run through the SIMD layer's one
//! dispatch (`simd::SimdJob`).

mod amx_products;
mod backward;
mod block;
pub mod cache;
mod forward;
mod key_tiles;
mod micro;
mod nonfinite;
mod pack;
pub(crate) mod paged;
mod pairs;
mod plan;
mod row_masks;
mod scores;
mod split;
mod workspace;

use rayon::prelude::*;

use crate::amx::{TileChoice, TileUnit};
use crate::error::Result;
use crate::merge::{fold_sink_rows, SinkRows};
use crate::output::{AttnOutput, Path};
use crate::problem::{Dims, Precision, Problem};
use crate::simd::{Isa, KvElem, Simd, SimdJob, Target};
use crate::view::View4;
pub(crate) use backward::backward;
pub use backward::BackwardTuning;
pub(crate) use block::with_rows;
use block::{Ctx, Job, Outs, Rest, Work};
use forward::run;
pub(crate) use micro::{qk_panel, Bf16Pairs};
pub(crate) use pack::{pack_dim_pairs, panel_len};
pub(crate) use pairs::transpose_pairs;
use plan::Plan;
pub use plan::{decodes, Tuning, BLOCK_ROWS, BLOCK_ROWS_STREAMING, DECODE_ROWS, MIN_SHARD_KEYS, PACK_BUDGET};

/// One block of query rows through the forward (`forward::run`) as a job for the call's
/// instruction set.
struct Block<'a, 'c, E> {
    cx: &'a Ctx<'c, E>,
    panels: Option<&'a [f32]>,
    job: &'a Job,
    outs: Outs<'a>,
    w: &'a mut Work,
}

impl<E: KvElem> SimdJob for Block<'_, '_, E> {
    type Out = ();
    const ON_PORTABLE: bool = E::ON_PORTABLE;
    const ON_AVX512_BF16: bool = true;

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: the CPU has `S` (the caller's contract); `forward` below gives each block the
        // packing of its head for the target's lanes, which are `S::W`.
        unsafe { run::<S, E>(self.cx, self.panels, self.job, self.outs, self.w) }
    }
}

/// Flash attention with instruction set `isa` (which must be available). `q: [B, Hq, Lq, Dk]`,
/// `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`, validated into `pb`; returns `out: [B, Hq, Lq, Dv]`,
/// `lse: [B, Hq, Lq]` and, with `want_weights`, the weights `[B, Hq, Lq, Lk]`; refuses buffers
/// too large to allocate.
pub(crate) fn forward<E: KvElem>(
    isa: Isa,
    q: &View4<f32>,
    k: &View4<E>,
    v: &View4<E>,
    pb: &Problem<f32>,
    want_weights: bool,
    tuning: Tuning,
) -> Result<AttnOutput<f32>> {
    let target = Target::new(isa).bf16_products(pb.compute == Precision::Bf16);
    let w = target.lanes();
    let d = pb.dims;
    let AttnOutput { mut out, mut lse, mut lse_residue, mut weights, .. } =
        AttnOutput::alloc(&d, want_weights, f32::NEG_INFINITY)?;
    let threads = rayon::current_num_threads();
    let plan = Plan::new(&d, w, want_weights, pb.elem.block.is_some(), pb.compute, tuning, threads);
    let path = Some(if plan.decode { Path::Decode } else { Path::Prefill });
    if out.is_empty() && lse.is_empty() {
        return Ok(AttnOutput { out, lse, lse_residue, weights, path });
    }
    // Prefill jobs each meet the value rows of their head: with several jobs per head, listing the
    // non-finite rows once (one pass over the values, under 1% of the work then) spares every
    // masked tile a scan of its columns' rows. Listed per chunk once its packing is allocated, so
    // a call too large to pack is refused before any pass over its values.
    let tiles = tile_unit(tuning.tiles, pb.compute, plan.decode, &d, w);
    let listed = !plan.decode && plan.jobs.len() >= 4 * d.b * d.hkv;
    let plen = plan.panel_len;
    let mut outs = Rest { o: &mut out, lse: &mut lse, residue: &mut lse_residue, w: weights.as_deref_mut() };
    for chunk in plan.chunks(d.hkv) {
        let first = chunk[0].b * d.hkv + chunk[0].kvh;
        let heads = if plan.decode { 0 } else { plan.heads_per_chunk.min(d.b * d.hkv - first) };
        let mut panels = workspace::take(&[heads, plen])?;
        let bad_values = listed.then(|| nonfinite::nonfinite_rows(v, first..first + heads));
        let cx = Ctx { pb, q: *q, k: *k, v: *v, bad_values, tiles };
        panels.par_chunks_mut(plen.max(1)).enumerate().for_each(|(x, p)| {
            let hh = first + x;
            pack::pack_head(k, v, hh / d.hkv, hh % d.hkv, w, pb.compute, p);
        });
        let block = |job: &Job, outs: Outs, w: &mut Work| {
            let panels = (!plan.decode).then(|| &panels[(job.b * d.hkv + job.kvh - first) * plen..][..plen]);
            target.run(Block { cx: &cx, panels, job, outs, w })
        };
        let chunk_outs: Vec<(Job, Outs)> = chunk.iter().map(|j| (j.clone(), outs.take(j.rows(), d.dv, d.lk))).collect();
        if plan.shards == 1 {
            chunk_outs.into_par_iter().for_each_init(Work::default, |w, (job, o)| block(&job, o, w));
        } else {
            split::run_split(&block, chunk_outs, plan.shards, d.lk, d.dv)?;
        }
        workspace::give(panels);
    }
    if let Some(sinks) = pb.sinks {
        let weights = weights.as_deref_mut().map(|w| (w, d.lk));
        let rows = SinkRows { out: &mut out, dv: d.dv, lse: &mut lse, residue: Some(&mut lse_residue), weights };
        fold_sink_rows(sinks, d.lq, rows);
    }
    Ok(AttnOutput { out, lse, lse_residue, weights, path })
}

/// The tiles a call's forward products run on: the bfloat16 prefill products, where `choice`
/// resolves to a unit and the sizes fit the tiles (`amx_products::fits` for vector width `w`).
fn tile_unit(choice: TileChoice, compute: Precision, decode: bool, d: &Dims, w: usize) -> Option<TileUnit> {
    let fit = compute == Precision::Bf16 && !decode && amx_products::fits(d.dk, d.dv, w);
    choice.resolve().filter(|_| fit)
}

/// Whether a call of sizes `d` with `compute` products, on the flash kernel of `isa` and its
/// automatic plan, runs its forward products on the CPU's AMX tiles (what `attn bench` reports).
pub fn runs_on_amx(isa: Isa, compute: Precision, d: &Dims) -> bool {
    isa.is_available() && {
        let w = Target::new(isa).lanes();
        tile_unit(TileChoice::Auto, compute, decodes(d), d, w) == Some(TileUnit::Hardware)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_take_the_bf16_prefill_products_of_head_sizes_in_32s_at_width_16() {
        let d = |lq, dk, dv| Dims { b: 1, hq: 2, hkv: 2, lq, lk: 100, dk, dv };
        let unit = |choice, compute, dims: Dims, w| tile_unit(choice, compute, decodes(&dims), &dims, w);
        let (bf16, emulated) = (Precision::Bf16, TileChoice::Emulated);
        assert_eq!(unit(emulated, bf16, d(64, 64, 64), 16), Some(TileUnit::Emulated));
        assert_eq!(unit(emulated, bf16, d(64, 128, 32), 16), Some(TileUnit::Emulated));
        // f32 products, the decode path, head sizes off 32, the 8-lane packing, tiles off.
        assert_eq!(unit(emulated, Precision::F32, d(64, 64, 64), 16), None);
        assert_eq!(unit(emulated, bf16, d(4, 64, 64), 16), None);
        for (dk, dv) in [(48, 64), (64, 48), (16, 16), (0, 32)] {
            assert_eq!(unit(emulated, bf16, d(64, dk, dv), 16), None, "dk {dk}, dv {dv}");
        }
        assert_eq!(unit(emulated, bf16, d(64, 64, 64), 8), None);
        assert_eq!(unit(TileChoice::Off, bf16, d(64, 64, 64), 16), None);
        // The hardware only where its tiles are ready.
        let ready = crate::amx::status() == crate::amx::Status::Ready;
        assert_eq!(unit(TileChoice::Auto, bf16, d(64, 64, 64), 16).is_some(), ready);
        assert_eq!(runs_on_amx(Isa::Avx512, bf16, &d(64, 64, 64)), ready);
        assert!(!runs_on_amx(Isa::Avx2, bf16, &d(64, 64, 64)));
    }
}
