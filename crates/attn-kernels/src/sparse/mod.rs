//! Programmable and block-sparse masks: a mask given as a Rust predicate ([`MaskMod`]) and its
//! block-sparse description ([`BlockMask`]), which tells the kernels which key blocks each query
//! block touches so that they visit only those.
//!
//! The grid is [`SPARSE_BLOCK`] × [`SPARSE_BLOCK`] (queries × keys). Each block of a
//! `(batch, head, query block)` row is one of three [`BlockClass`]es:
//! - **full**: every pair allowed; the kernels compute it without evaluating the predicate;
//! - **partial**: some pairs allowed; building the mask decides them once ([`MaskMod::keep_row`],
//!   one call per query row of the block), into one 64-bit word per row, which the flash kernels
//!   apply (they never call the predicate);
//! - **empty**: nothing allowed; never listed, never visited.
//!
//! A call's [`MaskSpec::block`](crate::MaskSpec) combines with its other masks by AND: a pair is
//! allowed when its block is full, or partial and the predicate keeps it, and every other mask
//! allows it. The reference kernel evaluates exactly that per element (it stays the oracle); the
//! flash kernels visit only listed blocks, in the forward (query block → key blocks) and in the
//! backward (key block → query blocks, the transposed lists).
//!
//! [`patterns`] holds the primitive patterns (bands, global tokens, documents, strides, random
//! blocks), whose blocks are classified without visiting their elements; [`Pattern`] the named
//! patterns of the literature built from them, [`PatternParts`] one of them from its parameters
//! given one by one (a command line's flags).

mod bits;
mod block_mask;
mod combine;
mod named;
mod parts;
pub mod patterns;
mod tile;

pub use block_mask::{BlockMask, BlockShape};
pub use combine::{And, MaskModExt, Or};
pub use named::Pattern;
pub use parts::{PatternParts, PATTERN_NAMES};
pub(crate) use tile::{Seg as TileSeg, TileBlocks, TileWords, TILE_BITS};

use std::ops::Range;

/// The positions `a·SPARSE_BLOCK..(z + 1)·SPARSE_BLOCK` of each run `a..=z` of consecutive block
/// indices in the sorted `blocks`, clamped to `within`; empty runs are left out.
pub(crate) fn runs(blocks: &[u32], within: Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut x = 0;
    std::iter::from_fn(move || {
        while x < blocks.len() {
            let mut y = x + 1;
            while y < blocks.len() && blocks[y] == blocks[y - 1] + 1 {
                y += 1;
            }
            let a = (blocks[x] as usize * SPARSE_BLOCK).max(within.start);
            let z = ((blocks[y - 1] as usize + 1) * SPARSE_BLOCK).min(within.end);
            x = y;
            if a < z {
                return Some(a..z);
            }
        }
        None
    })
}

/// Queries and keys per block of a [`BlockMask`]: a multiple of every key panel and of the
/// backward's key block, so the kernels' tiles fall on block edges.
pub const SPARSE_BLOCK: usize = 64;

/// How much of one block a mask allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockClass {
    /// No pair.
    Empty,
    /// Some pairs: the predicate decides each.
    Partial,
    /// Every pair.
    Full,
}

impl BlockClass {
    /// The class of a block where `any` pair is allowed and `all` pairs are.
    pub fn of(any: bool, all: bool) -> Self {
        match (any, all) {
            (false, _) => BlockClass::Empty,
            (true, true) => BlockClass::Full,
            (true, false) => BlockClass::Partial,
        }
    }
}

/// A mask as a predicate over `(batch, head, query, key)` indices (FlexAttention's `mask_mod`):
/// `true` means the query may attend to the key. Implement [`keep`](MaskMod::keep); override
/// [`keep_row`](MaskMod::keep_row) when a row has a faster form, and [`classify`](MaskMod::classify)
/// when whole blocks can be judged without visiting their elements (every built-in pattern does,
/// so building its [`BlockMask`] costs O(blocks)).
pub trait MaskMod: Send + Sync {
    /// Whether query `q` of head `h` in batch entry `b` may attend key `kv`.
    fn keep(&self, b: usize, h: usize, q: usize, kv: usize) -> bool;

    /// `out[c] = keep(b, h, q, kv0 + c)` for a segment of one row.
    fn keep_row(&self, b: usize, h: usize, q: usize, kv0: usize, out: &mut [bool]) {
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.keep(b, h, q, kv0 + c);
        }
    }

    /// The class of the block `qs × ks` for `(b, h)`. [`BlockClass::Partial`] is always a correct
    /// answer (the kernels then evaluate the predicate); `Full` and `Empty` must be exact. The
    /// default visits every element.
    fn classify(&self, b: usize, h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        let mut row = [false; SPARSE_BLOCK];
        let (mut any, mut all) = (false, true);
        for q in qs {
            for k0 in ks.clone().step_by(SPARSE_BLOCK) {
                let seg = &mut row[..SPARSE_BLOCK.min(ks.end - k0)];
                self.keep_row(b, h, q, k0, seg);
                any |= seg.iter().any(|&x| x);
                all &= seg.iter().all(|&x| x);
            }
            if any && !all {
                return BlockClass::Partial;
            }
        }
        BlockClass::of(any, all)
    }
}

impl<F: Fn(usize, usize, usize, usize) -> bool + Send + Sync> MaskMod for F {
    fn keep(&self, b: usize, h: usize, q: usize, kv: usize) -> bool {
        self(b, h, q, kv)
    }
}
