//! What the steps of a backward job share: the worker's buffers ([`BwdWork`]), how the job
//! multiplies ([`Form`]), where a tile sits ([`TileAt`]) and the tiles' geometry (row stride
//! [`LDB`], micro-kernel row chunks).

use super::super::{BwdCtx, KEY_BLOCK};
use crate::flash::block::{qk_chunks, TileWork};
use crate::lines::Lines;
use crate::sparse::TileBlocks;

/// Row stride of the `[BWD_MAX_TILE_ROWS, KEY_BLOCK]` tiles.
pub(super) const LDB: usize = KEY_BLOCK;

/// A worker's buffers, reused from job to job.
#[derive(Default)]
pub struct BwdWork {
    /// Packed keys and values of the block, `[D][2·W]` panels.
    pub(super) kp: Lines<f32>,
    pub(super) vp: Lines<f32>,
    /// Queries and output gradients transposed per micro-kernel row chunk: of the job's heads
    /// when they fit [`TRANSPOSED_BUDGET`], else of the tile.
    pub(super) qt: Lines<f32>,
    pub(super) dot: Lines<f32>,
    /// Scores `S`, probabilities `P` (and `P̄` under dropout), `dP` then `dS` then `dX`, the
    /// score modification's and the soft-cap's derivatives, the scaled products before the
    /// modification: `[BWD_MAX_TILE_ROWS, LDB]`.
    pub(super) s: Lines<f32>,
    pub(super) p: Lines<f32>,
    pub(super) pd: Lines<f32>,
    pub(super) dp: Lines<f32>,
    pub(super) dmod: Lines<f32>,
    pub(super) dcap: Lines<f32>,
    pub(super) x: Lines<f32>,
    /// One row's gradient of the modified score, `[LDB]`, and the tile's table gradient.
    pub(super) g: Lines<f32>,
    pub(super) dtable: Lines<f32>,
    /// With bfloat16 products: the block's keys in pairs of keys (`pack::pack_key_pairs`), then
    /// per tile `P̄` or `dX` paired two query rows at a time `[⌈BWD_MAX_TILE_ROWS/2⌉, LDB]` followed
    /// by the tile's `dO` or `Q` rows paired alike, and `dX` paired per key panel
    /// `[BWD_MAX_TILE_ROWS, LDB/2]`.
    pub(super) kk: Lines<f32>,
    pub(super) rows2: Lines<f32>,
    pub(super) keys2: Lines<f32>,
    /// The block's `dK` `[KEY_BLOCK, Dk]` and `dV` `[KEY_BLOCK, Dv]`.
    pub(super) dk: Lines<f32>,
    pub(super) dv: Lines<f32>,
    /// `Δ_i = dO_i·O_i` of the job's rows, `[Hq/Hkv, Lq]`.
    pub(super) delta: Vec<f32>,
    /// `W` rows of `dO` and then of `O` transposed, `2 × [slots][W]` (`deltas`).
    pub(super) dt: Vec<f32>,
    /// Block columns whose key row holds a non-finite number.
    pub(super) bad_keys: Vec<usize>,
    /// The tiles' spans of the block: `(query head, first row, end row)`.
    pub(super) spans: Vec<(usize, usize, usize)>,
    /// Per row of the tile, the block's columns `a..z` its band allows (`a >= z`: none); both
    /// ends grow with the row.
    pub(super) band: Vec<(usize, usize)>,
    /// A block mask's segments of the tile last masked.
    pub(super) blocks: TileBlocks,
    /// On tiles: the tile's query rows (or, for `dV` and `dK`, the columns of its `dO` or `Q` rows) as
    /// bfloat16 pairs, the accumulators, the emulated tiles.
    pub(super) tiles: TileWork,
}

/// Most bytes of a worker's buffers that grow with the call (the job's transposed rows and `Δ`)
/// kept for its next job; beyond, they are dropped.
const KEPT_BYTES: usize = 2 << 20;

impl BwdWork {
    /// Drops the buffers that grew with the call when they hold more than [`KEPT_BYTES`], so
    /// that a worker keeps `O(tile)` plus at most that between calls.
    pub fn trim(&mut self) {
        let grown = self.qt.held_bytes() + self.dot.held_bytes() + self.delta.capacity() * 4;
        if grown > KEPT_BYTES {
            (self.qt, self.dot, self.delta) = Default::default();
        }
    }
}

pub(super) fn grow(v: &mut Lines<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// How a job multiplies (see the module header): its products' precision, whether its heads'
/// queries and output gradients are transposed once for all its key blocks (`whole`) or tile by
/// tile, and the rows its tiles start at multiples of (`unit`, see [`row_chunks`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Form {
    pub(super) whole: bool,
    pub(super) bf16: bool,
    pub(super) unit: usize,
}

impl Form {
    /// Slots of a row of `d` values: `d`, or `⌈d/2⌉` bfloat16 pairs.
    pub(super) fn slots(self, d: usize) -> usize {
        if self.bf16 {
            d.div_ceil(2)
        } else {
            d
        }
    }
}

/// Whether step 1's `S` reads the queries transposed per micro-kernel chunk (`qk_panel`): not
/// after a decode-path forward (`decode_scores` reads them in place) nor on AMX tiles
/// (`amx_products::prepare` stores them row-major).
pub(super) fn transposes_queries(cx: &BwdCtx, form: Form) -> bool {
    !(cx.decode_scores || (form.bf16 && cx.tiles.is_some()))
}

/// The micro-kernel row chunks `(first row, rows)` of a tile of `rows` rows that starts at a
/// multiple of `unit` (a head's rows from 0 included): each `unit` rows, the last possibly fewer,
/// cut by `qk_chunks` into calls of at most `rq` near-equal rows. With `unit == rq` these are the
/// multiples of `rq`; with a query block as `unit`, a block's chunks are the same in its tile as
/// in its head's transposition (64 rows as 11, 11, 11, 11, 10, 10 for `rq` 12).
pub(super) fn row_chunks(rows: usize, unit: usize, rq: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows).step_by(unit).flat_map(move |u0| qk_chunks(unit.min(rows - u0), rq).map(move |(a, n)| (u0 + a, n)))
}

/// Where one tile sits: query rows `i0..i0+nr` of head `h` against keys `j0..j0+n` of the job's
/// block.
#[derive(Debug, Clone, Copy)]
pub(super) struct TileAt {
    pub(super) h: usize,
    pub(super) i0: usize,
    pub(super) nr: usize,
    pub(super) j0: usize,
    pub(super) n: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_drops_only_grown_buffers_past_the_limit() {
        let mut w = BwdWork::default();
        grow(&mut w.qt, 1000);
        grow(&mut w.s, 1000);
        w.trim();
        assert!(w.qt.held_bytes() >= 4000, "a small transposition is kept");
        grow(&mut w.dot, KEPT_BYTES / 4 + 1);
        w.trim();
        assert_eq!(w.qt.held_bytes() + w.dot.held_bytes(), 0, "grown past the limit: dropped");
        assert!(w.s.held_bytes() >= 4000, "tile buffers are kept");
    }
}
