//! The key tiles of a forward block. A tile is one or more segments of consecutive keys whose
//! scores lie side by side in the score block: without a block mask, steps of the tile's key count
//! over the block's keys (one segment each); with one, the runs of listed key blocks *gathered*, so
//! that a query block of BigBird (a global block, the window's run, isolated random blocks) is
//! scored, softmaxed and accumulated as two or three full tiles rather than five or six short ones
//! (each tile costs every row a running-maximum update and each micro-kernel call its output
//! loads, whatever its width).

use std::ops::Range;

use crate::sparse::runs;

/// Keys `j0..j0 + n` of a tile, scored into its columns `col..col + n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::flash) struct Seg {
    /// First column in the tile.
    pub col: usize,
    /// First key.
    pub j0: usize,
    /// Keys.
    pub n: usize,
}

/// The segments of every tile of a block whose rows see keys `start..hi`, in key order; a tile
/// starts at each segment of column 0 ([`tiles`] cuts them apart). `blocks`, a block mask's
/// listed key blocks (sorted), keeps only their runs within `start..hi`. A tile holds at most
/// `tile` keys; a segment is followed in its tile only when its length is a multiple of `align`
/// (so every segment's column is, and a tile's ragged end is its last segment), and a segment
/// after the first starts at a block edge.
pub(in crate::flash) fn key_tiles(
    start: usize,
    hi: usize,
    tile: usize,
    align: usize,
    blocks: Option<&[u32]>,
) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut col = 0;
    let mut add = |r: Range<usize>| {
        let mut j0 = r.start;
        while j0 < r.end {
            let n = (tile - col).min(r.end - j0);
            segs.push(Seg { col, j0, n });
            (col, j0) = (col + n, j0 + n);
            if col == tile || !n.is_multiple_of(align) {
                col = 0;
            }
        }
    };
    match blocks {
        None => add(start..hi),
        Some(bl) => runs(bl, start..hi).for_each(add),
    }
    segs
}

/// The tiles of [`key_tiles`]'s segments, each its segments.
pub(in crate::flash) fn tiles(segs: &[Seg]) -> impl Iterator<Item = &[Seg]> {
    segs.chunk_by(|_, b| b.col != 0)
}

/// The columns a tile's scores fill: its last segment's end.
pub(in crate::flash) fn tile_columns(tile: &[Seg]) -> usize {
    tile.last().map_or(0, |s| s.col + s.n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::SPARSE_BLOCK;

    /// Every key of the listed runs once, in order, each tile at most `tile` keys, columns
    /// consecutive from 0, segments after a tile's first on block edges and following whole
    /// aligned segments.
    fn check(start: usize, hi: usize, tile: usize, align: usize, blocks: Option<&[u32]>) -> Vec<Vec<(usize, usize)>> {
        let segs = key_tiles(start, hi, tile, align, blocks);
        let want: Vec<usize> = match blocks {
            None => (start..hi).collect(),
            Some(bl) => runs(bl, start..hi).flatten().collect(),
        };
        let got: Vec<usize> = segs.iter().flat_map(|s| s.j0..s.j0 + s.n).collect();
        assert_eq!(got, want, "keys of {start}..{hi}");
        for t in tiles(&segs) {
            assert!(tile_columns(t) <= tile);
            for (a, b) in t.iter().zip(&t[1..]) {
                assert_eq!(b.col, a.col + a.n);
                assert!(a.n.is_multiple_of(align) && b.j0.is_multiple_of(SPARSE_BLOCK));
            }
        }
        tiles(&segs).map(|t| t.iter().map(|s| (s.j0, s.n)).collect()).collect()
    }

    #[test]
    fn gathers_the_runs_of_listed_blocks_into_full_tiles() {
        // BigBird's query block 20: the global block, the window's five blocks, three random ones.
        let bl = [0, 18, 19, 20, 21, 22, 40, 90, 200];
        let got = check(0, 16384, 192, 32, Some(&bl));
        assert_eq!(got, [vec![(0, 64), (1152, 128)], vec![(1280, 192)], vec![(2560, 64), (5760, 64), (12800, 64)]]);
        // Without a mask: steps of the tile, the last one short.
        assert_eq!(check(32, 500, 192, 32, None), [vec![(32, 192)], vec![(224, 192)], vec![(416, 84)]]);
        // A ragged run (clamped at `hi`) ends its tile.
        assert_eq!(check(0, 100, 192, 32, Some(&[0, 1])), [vec![(0, 100)]]);
        assert_eq!(check(0, 300, 192, 32, Some(&[0, 4])), [vec![(0, 64), (256, 44)]]);
        assert_eq!(check(0, 300, 192, 32, Some(&[1, 2, 3, 4])), [vec![(64, 192)], vec![(256, 44)]]);
        // An unaligned start (the decode path) is its own tile's first segment.
        assert_eq!(check(5, 400, 256, 16, Some(&[0, 3, 5])), [vec![(5, 59)], vec![(192, 64), (320, 64)]]);
        assert!(check(10, 10, 192, 32, Some(&bl)).is_empty());
    }
}
