//! The fast forward kernel: tiled online softmax ("flash attention") in f32 with every semantic
//! of the reference, O(tile) extra memory per thread (plus the packed keys of the heads in
//! flight), and work spread over rayon's threads.
//!
//! This module is the entry point, `forward`: it picks the micro-kernels' instruction set, asks
//! `plan` how to cut the call (prefill or decode path, packing chunks, split-KV shards; the rules
//! are there), packs each chunk's keys (and, with bfloat16 products, values) into panels (`pack`,
//! in a reused `workspace` buffer) and
//! runs the jobs on rayon's threads, whole (`forward::run`, one block of query rows through the
//! online softmax) or as key shards merged through their log-sum-exps (`split`). Attention sinks
//! are joined after every job, once per row (`merge::fold_sink_rows`): the blocks and shards
//! never see them.
//!
//! The pieces of a block live beside it: the shared block types and tile geometry (`block`), the
//! score tile and its masking (`scores`, shared by every pass that recomputes scores), the
//! micro-kernels (`micro`), written once over `simd::Simd` and instantiated for AVX-512F,
//! AVX2+FMA+F16C and portable Rust; the entry points below carry the matching
//! `#[target_feature]` and are only called after [`Isa::is_available`].

/// Defines the module `entry` of the per-ISA entry points of `$run`, an `#[inline(always)]`
/// function generic over `S: Simd` (and, when named as `$run<E>`, over the storage type
/// `E: KvElem` of keys and values) with the given arguments: one function per instruction set
/// carrying its `#[target_feature]` (so the whole of `$run` is compiled for it), and
/// `entry::of(isa, compute)` (`entry::of::<E>`), the one for `isa` with its vector width `W`:
/// AVX-512F's own, or with [`Precision::Bf16`] on a CPU that has AVX512-BF16, the one that
/// multiplies with `VDPBF16PS`. The portable kernel is compiled for `f32` storage only
/// ([`KvElem::ON_PORTABLE`]): the other types reach it widened (`dispatch`). Forward and backward
/// both enter through it; the caller's module must have `KvElem`, `Isa`, `Precision` and the
/// argument types in scope.
macro_rules! isa_entries {
    ($run:ident $(<$e:ident>)? ($($arg:ident: $ty:ty),*)) => {
        /// The per-ISA entry points (see `isa_entries!`).
        mod entry {
            use super::*;

            /// The entry point for `isa` (which must be available) and products in `compute`,
            /// and its vector width.
            pub fn of$(<$e: KvElem>)?(isa: Isa, compute: Precision) -> (unsafe fn($($ty),*), usize) {
                #[cfg(target_arch = "x86_64")]
                if isa == Isa::Avx512 && compute == Precision::Bf16 && Isa::has_avx512_bf16() {
                    return (avx512_bf16$(::<$e>)?, 16);
                }
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => (avx512$(::<$e>)?, 16),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => (avx2$(::<$e>)?, 8),
                    #[cfg(not(target_arch = "x86_64"))]
                    Isa::Avx512 | Isa::Avx2 => unreachable!("x86 instruction sets are never available here"),
                    // A branch on the constant, so that only `f32`'s is compiled.
                    Isa::Portable => if true $(&& <$e as KvElem>::ON_PORTABLE)? {
                        (portable$(::<$e>)?, 8)
                    } else {
                        unreachable!("f16 and bf16 reach the portable kernel widened to f32")
                    },
                }
            }

            /// # Safety
            /// The CPU supports AVX-512F; otherwise as for the inlined function.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            pub unsafe fn avx512$(<$e: KvElem>)?($($arg: $ty),*) {
                // SAFETY: forwarded from the caller.
                unsafe { $run::<crate::flash::simd::Avx512 $(, $e)?>($($arg),*) }
            }

            /// # Safety
            /// The CPU supports AVX-512F and AVX512-BF16; otherwise as for the inlined function.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bf16")]
            pub unsafe fn avx512_bf16$(<$e: KvElem>)?($($arg: $ty),*) {
                // SAFETY: forwarded from the caller.
                unsafe { $run::<crate::flash::simd::Avx512Bf16 $(, $e)?>($($arg),*) }
            }

            /// # Safety
            /// The CPU supports AVX2, FMA and F16C; otherwise as for the inlined function.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            pub unsafe fn avx2$(<$e: KvElem>)?($($arg: $ty),*) {
                // SAFETY: forwarded from the caller.
                unsafe { $run::<crate::flash::simd::Avx2 $(, $e)?>($($arg),*) }
            }

            /// # Safety
            /// As for the inlined function.
            pub unsafe fn portable$(<$e: KvElem>)?($($arg: $ty),*) {
                // SAFETY: forwarded from the caller.
                unsafe { $run::<crate::flash::simd::Portable $(, $e)?>($($arg),*) }
            }
        }
    };
}

mod backward;
mod block;
pub mod cache;
mod forward;
mod micro;
mod nonfinite;
mod pack;
mod pairs;
mod plan;
mod row_masks;
mod scores;
pub(crate) mod simd;
mod softcap;
mod split;
mod tile_products;
mod workspace;

use rayon::prelude::*;

use crate::amx::{TileChoice, TileUnit};
use crate::error::Result;
use crate::isa::Isa;
use crate::merge::{fold_sink_rows, SinkRows};
use crate::problem::{Dims, Precision, Problem};
use crate::reference::AttnOutput;
use crate::view::View4;
pub(crate) use backward::backward;
pub use backward::BackwardTuning;
use block::{Ctx, Job, Outs, Rest, Work};
use forward::run;
use plan::Plan;
pub use plan::{decodes, Path, Tuning, BLOCK_ROWS, BLOCK_ROWS_STREAMING, DECODE_ROWS, MIN_SHARD_KEYS, PACK_BUDGET};
use simd::KvElem;
pub(crate) use softcap::softcap_any;

/// One block of query rows through the forward, compiled for one instruction set (an entry point).
type BlockFn<E> = unsafe fn(&Ctx<E>, Option<&[f32]>, &Job, Outs, &mut Work);

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
    assert!(isa.is_available(), "flash kernel entered without {isa:?} support");
    let (run, w) = entry::of::<E>(isa, pb.compute);
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
        let panels_of = |job: &Job| (!plan.decode).then(|| &panels[(job.b * d.hkv + job.kvh - first) * plen..][..plen]);
        let chunk_outs: Vec<(Job, Outs)> = chunk.iter().map(|j| (j.clone(), outs.take(j.rows(), d.dv, d.lk))).collect();
        if plan.shards == 1 {
            chunk_outs.into_par_iter().for_each_init(Work::default, |w, (job, o)| {
                // SAFETY: `isa` is available (asserted above); panels belong to the job's head.
                unsafe { run(&cx, panels_of(&job), &job, o, w) }
            });
        } else {
            // SAFETY: as above.
            unsafe { split::run_split(&cx, run, &panels_of, chunk_outs, plan.shards, d.lk, d.dv) }?;
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
/// resolves to a unit and the sizes fit the tiles (`tile_products::fits` for vector width `w`).
fn tile_unit(choice: TileChoice, compute: Precision, decode: bool, d: &Dims, w: usize) -> Option<TileUnit> {
    let fit = compute == Precision::Bf16 && !decode && tile_products::fits(d.dk, d.dv, w);
    choice.resolve().filter(|_| fit)
}

/// Whether a call of sizes `d` with `compute` products, on the flash kernel of `isa` and its
/// automatic plan, runs its forward products on the CPU's AMX tiles (what `attn bench` reports).
pub fn runs_on_amx(isa: Isa, compute: Precision, d: &Dims) -> bool {
    let w = if isa == Isa::Avx512 { 16 } else { 8 };
    tile_unit(TileChoice::Auto, compute, decodes(d), d, w) == Some(TileUnit::Hardware)
}

isa_entries!(run<E>(cx: &Ctx<E>, panels: Option<&[f32]>, job: &Job, outs: Outs, w: &mut Work));

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
