//! What every block of query rows shares, whichever pass runs it: the call's inputs ([`Ctx`]), one
//! unit of work ([`Job`]), its output rows ([`Outs`], handed out by [`Rest`]), per-worker scratch
//! ([`Work`]) and the tile geometry (keys per tile, the score block's constant row stride
//! [`LDS`], rows per micro-kernel call and the `with_rows!` dispatch on them).
//!
//! A block is `nh` query heads of one key/value head group × `ni` consecutive queries (decode
//! stacks all heads of a group so each key/value row is read once for all of them). Two tile
//! geometries exist, chosen by whether the keys were packed: packed (prefill) tiles hold about two
//! L1 data caches of keys ([`tile_floats`]), a multiple of the panel width; unpacked (decode) tiles
//! hold [`DECODE_TILE_KEYS`] keys.

use std::ops::Range;

use crate::amx::{Emulated, TileUnit};
use crate::lines::Lines;
use crate::problem::Problem;
use crate::simd::Simd;
use crate::sparse::TileBlocks;
use crate::view::View4;

/// Floats of packed keys per prefill tile (`keys × Dk`): twice what this CPU's L1 data cache
/// holds (16384 for 32 KiB, 24576 for 48 KiB), at most [`MAX_TILE_KEYS`] keys. A tile need not
/// fit in L1: the scores run one key panel at a time over all the block's rows, and `P·V` one
/// chunk of value rows at a time (`forward::accumulate::pv_spans`), so the tile's size sets only
/// how many keys each row's softmax step, rescaling and output pass serve: twice L1 was faster
/// than L1's worth, and more gained nothing (see docs/performance-log.md,
/// "attn-kernels/src/flash/block.rs: tile_floats").
pub fn tile_floats() -> usize {
    (super::cache::caches().l1d / 2).clamp(8192, 32768)
}
/// Keys per tile in the decode path.
pub const DECODE_TILE_KEYS: usize = 256;
/// The most keys a tile holds, in either path.
const MAX_TILE_KEYS: usize = 256;
const _: () = assert!(DECODE_TILE_KEYS <= MAX_TILE_KEYS);
/// Row stride of the score block: the most keys a tile holds rounded up by two vectors of the
/// widest ISA. A constant, so the micro-kernels address each row at a fixed offset rather than
/// spending integer instructions (on the vector ports) on `r · stride`.
pub(super) const LDS: usize = MAX_TILE_KEYS + 32;

/// Keys per tile for head dimension `dk`: [`tile_floats`] worth of packed keys (a multiple of 32,
/// every ISA's panel width, at most the largest tile) when `packed`, else [`DECODE_TILE_KEYS`].
pub(super) fn tile_keys(dk: usize, packed: bool) -> usize {
    if packed {
        (tile_floats() / dk.max(1)).clamp(32, MAX_TILE_KEYS) / 32 * 32
    } else {
        DECODE_TILE_KEYS
    }
}

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
    /// For each key/value head `(b, kvh)` (at `b·Hkv + kvh`), the keys whose value row holds a
    /// non-finite number, sorted (`nonfinite::nonfinite_rows`); `None` where the call did not list
    /// them (the decode path, which scans its tiles' value rows itself).
    pub bad_values: Option<Vec<Vec<usize>>>,
    /// The tiles the bfloat16 prefill products run on (`amx_products`), if any.
    pub tiles: Option<TileUnit>,
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

    /// The query head and query index of block row `r`.
    pub(super) fn head_query(&self, r: usize) -> (usize, usize) {
        (self.h0 + r / self.ni, self.i0 + r % self.ni)
    }
}

/// A block's outputs: `o: [rows, Dv]` (zeroed), `lse: [rows]`, `residue: [rows]`,
/// `weights: [rows, Lk]` (zeroed).
pub struct Outs<'o> {
    /// Output rows.
    pub o: &'o mut [f32],
    /// Log-sum-exp per row (natural log).
    pub lse: &'o mut [f32],
    /// The rounding residue of each `lse`.
    pub residue: &'o mut [f32],
    /// Weights rows, when asked for.
    pub weights: Option<&'o mut [f32]>,
}

/// The not yet handed out tail of a call's output buffers `o: [rows, Dv]`, `lse: [rows]`,
/// `residue: [rows]` and `w: [rows, Lk]`, cut into the [`Outs`] of consecutive jobs.
pub(super) struct Rest<'o> {
    pub(super) o: &'o mut [f32],
    pub(super) lse: &'o mut [f32],
    pub(super) residue: &'o mut [f32],
    pub(super) w: Option<&'o mut [f32]>,
}

impl<'o> Rest<'o> {
    /// Hands out the next `rows` rows.
    pub(super) fn take(&mut self, rows: usize, dv: usize, lk: usize) -> Outs<'o> {
        let (o, ro) = std::mem::take(&mut self.o).split_at_mut(rows * dv);
        let (l, rl) = std::mem::take(&mut self.lse).split_at_mut(rows);
        let (res, rres) = std::mem::take(&mut self.residue).split_at_mut(rows);
        self.o = ro;
        self.lse = rl;
        self.residue = rres;
        let weights = self.w.take().map(|w| {
            let (a, b) = w.split_at_mut(rows * lk);
            self.w = Some(b);
            a
        });
        Outs { o, lse: l, residue: res, weights }
    }
}

/// The most rows of any micro-kernel call ([`rows_per_call`], `with_rows!`).
pub(in crate::flash) const MAX_ROWS_PER_CALL: usize = 12;

/// Rows per `qk_panel` call and per `pv` call on `S`: its register blocking
/// ([`Simd::QK_ROWS`], [`Simd::PV_ROWS`]). On 8-lane ISAs 6×2 vectors for both, i.e. 12
/// accumulators + 2 operand vectors + 1 broadcast = 15 registers, with enough independent FMA
/// chains to cover the FMA latency (4×2 and 3×4 were slower: too few chains, and 3×4 spilled; see
/// docs/performance-log.md, "attn-kernels/src/flash/block.rs: rows_per_call").
pub(in crate::flash) fn rows_per_call<S: Simd>() -> (usize, usize) {
    (S::QK_ROWS, S::PV_ROWS)
}

/// The chunks `(first row, rows)` of a block of `rows` rows for `qk_panel` calls of at most `rq`
/// rows: as few calls as `rq` allows, their sizes differing by at most one. A call of few rows is
/// bound by its loads rather than its multiply-adds, so a block of 64 rows (a block mask's query
/// block) goes as 11, 11, 11, 11, 10, 10 rather than 12 × 5 + 4; multiples of `rq` are cut as
/// before.
pub(in crate::flash) fn qk_chunks(rows: usize, rq: usize) -> impl Iterator<Item = (usize, usize)> {
    let calls = rows.div_ceil(rq.max(1));
    let (base, extra) = (rows.checked_div(calls).unwrap_or(0), rows.checked_rem(calls).unwrap_or(0));
    (0..calls).map(move |c| (c * base + c.min(extra), base + usize::from(c < extra)))
}

/// Calls the micro-kernel `$f` with its row count `R` (a const generic) set to the run-time `$n`,
/// which is at most `$max` (4, 6 or 12; a constant, such as [`Simd::QK_ROWS`]):
/// `with_rows!(max, n, f::<Generics; Consts>(args))` is `f::<Generics, n, Consts>(args)` (each const a block, `{ 4 }`). Only the
/// row counts up to `$max` are instantiated: the match on the constant is resolved when the
/// caller is monomorphised, and the compiler emits only the arm taken — each instantiation is a
/// whole inlined micro-kernel, and the ones past the bound were a third of the crate's code.
macro_rules! with_rows {
    ($max:expr, $n:expr, $($call:tt)*) => {
        match $max {
            4 => with_rows!(@chain $n; [1 2 3 4]; $($call)*),
            6 => with_rows!(@chain $n; [1 2 3 4 5 6]; $($call)*),
            12 => with_rows!(@chain $n; [1 2 3 4 5 6 7 8 9 10 11 12]; $($call)*),
            _ => unreachable!("row bounds are 4, 6 or 12"),
        }
    };
    // One comparison per row count (LLVM makes the chain a jump table).
    (@chain $n:expr; [$r:literal $($rest:literal)*]; $f:ident :: <$($g:ty),*; $($c:block),*> ($($arg:expr),*)) => {
        if $n == $r {
            $f::<$($g,)* $r $(, $c)*>($($arg),*)
        } else {
            with_rows!(@chain $n; [$($rest)*]; $f::<$($g),*; $($c),*>($($arg),*))
        }
    };
    (@chain $n:expr; []; $($call:tt)*) => {
        unreachable!("a row chunk past its bound")
    };
}
pub(crate) use with_rows;

/// Per-block working memory, reused from job to job by each worker.
#[derive(Default)]
pub struct Work {
    /// Queries: `[rows, Dk]` in the decode path; in the prefill path each chunk of `R` rows
    /// that one `qk_panel` call takes is stored transposed, `[Dk, R]` (`[⌈Dk/2⌉, R]` bfloat16
    /// pairs with bfloat16 products).
    pub(super) q: Lines<f32>,
    /// Scores / probabilities `[rows, LDS]`.
    pub(super) s: Lines<f32>,
    /// Probabilities rounded to bfloat16 pairs, `[rows, LDS / 2]` (bfloat16 products only).
    pub(super) p2: Lines<f32>,
    /// Running maximum per row.
    pub(super) m: Vec<f32>,
    /// Running denominator per row.
    pub(super) l: Vec<f32>,
    /// Allowed key range per row.
    pub(super) range: Vec<(usize, usize)>,
    /// A block mask's segments of the tile last masked.
    pub(super) blocks: TileBlocks,
    /// Per segment of the tile last scored, the columns that no row masks (`scores::scores`).
    pub(super) clean: Vec<Range<usize>>,
    /// On tiles: the queries as row-major bfloat16 pairs (`amx_products::prepare`), their
    /// row stride, the accumulators' buffer, and the software tiles when emulated.
    pub(super) tiles: TileWork,
}

/// A block's buffers for the products on tiles.
#[derive(Default)]
pub(in crate::flash) struct TileWork {
    /// Query pairs, `[rows rounded up to 32, Dk / 2]`.
    pub(in crate::flash) q: Vec<f32>,
    /// The query pairs' row stride.
    pub(in crate::flash) ldq: usize,
    /// Four accumulators stored (`amx_products::ACC_LEN` once used).
    pub(in crate::flash) acc: Vec<f32>,
    /// The emulated tiles (made on first use).
    pub(in crate::flash) emulated: Option<Box<Emulated>>,
}

impl Work {
    /// Prepares for a block of `rows` rows of head dimension `dk`: room for the queries and
    /// scores, maxima −∞, denominators 0, no key ranges.
    pub(super) fn reset(&mut self, rows: usize, dk: usize) {
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

/// The elements of head `(b, h)` of `t` onward (its rows `[L, D]` at row stride `ld`), and `ld`.
pub(in crate::flash) fn head<'a, E>(t: &View4<'a, E>, b: usize, h: usize) -> (&'a [E], usize) {
    let s = t.strides();
    (&t.data()[b * s[0] + h * s[1]..], s[2])
}

#[cfg(test)]
mod tests {
    use super::qk_chunks;

    #[test]
    fn qk_chunks_cover_the_rows_in_fewest_calls_of_near_equal_size() {
        for rq in [6, 12] {
            for rows in 0..200 {
                let chunks: Vec<_> = qk_chunks(rows, rq).collect();
                assert_eq!(chunks.len(), rows.div_ceil(rq), "{rows} rows by {rq}");
                let mut next = 0;
                for &(r0, nr) in &chunks {
                    assert_eq!(r0, next, "{rows} rows by {rq}: chunks are consecutive");
                    assert!((1..=rq).contains(&nr), "{rows} rows by {rq}: chunk of {nr}");
                    next += nr;
                }
                assert_eq!(next, rows, "{rows} rows by {rq}: every row once");
                let sizes = chunks.iter().map(|c| c.1);
                let (lo, hi) = (sizes.clone().min().unwrap_or(0), sizes.max().unwrap_or(0));
                assert!(hi - lo <= 1, "{rows} rows by {rq}: sizes {lo}..={hi}");
            }
        }
        assert_eq!(qk_chunks(64, 12).map(|c| c.1).collect::<Vec<_>>(), [11, 11, 11, 11, 10, 10]);
        assert_eq!(qk_chunks(24, 12).map(|c| c.1).collect::<Vec<_>>(), [12, 12]);
    }
}
