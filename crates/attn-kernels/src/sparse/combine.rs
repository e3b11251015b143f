//! Composition of [`MaskMod`]s: [`And`] (both allow) and [`Or`] (either allows), built with
//! [`MaskModExt::and`] / [`MaskModExt::or`]. Rows are evaluated segment by segment through each
//! part's own `keep_row`, and blocks classified from the parts' classes (exact where the classes
//! decide it, [`BlockClass::Partial`] otherwise).

use std::ops::Range;

use super::{BlockClass, MaskMod, SPARSE_BLOCK};

/// Pairs allowed by both masks.
#[derive(Debug, Clone, Copy)]
pub struct And<A, B>(pub A, pub B);

/// Pairs allowed by either mask.
#[derive(Debug, Clone, Copy)]
pub struct Or<A, B>(pub A, pub B);

/// Combinators on every [`MaskMod`].
pub trait MaskModExt: MaskMod + Sized {
    /// Pairs both `self` and `other` allow.
    fn and<B: MaskMod>(self, other: B) -> And<Self, B> {
        And(self, other)
    }
    /// Pairs `self` or `other` allows.
    fn or<B: MaskMod>(self, other: B) -> Or<Self, B> {
        Or(self, other)
    }
}

impl<M: MaskMod> MaskModExt for M {}

/// `out[c] = op(a[c], b[c])` with `a` written by `first` into `out` and `b` by `second`, segment
/// by segment of at most [`SPARSE_BLOCK`] keys.
fn combine_row(
    out: &mut [bool],
    kv0: usize,
    first: impl Fn(usize, &mut [bool]),
    second: impl Fn(usize, &mut [bool]),
    op: fn(bool, bool) -> bool,
) {
    let mut other = [false; SPARSE_BLOCK];
    for (x, seg) in out.chunks_mut(SPARSE_BLOCK).enumerate() {
        let k0 = kv0 + x * SPARSE_BLOCK;
        first(k0, seg);
        let o = &mut other[..seg.len()];
        second(k0, o);
        seg.iter_mut().zip(o.iter()).for_each(|(s, &t)| *s = op(*s, t));
    }
}

impl<A: MaskMod, B: MaskMod> MaskMod for And<A, B> {
    fn keep(&self, b: usize, h: usize, q: usize, kv: usize) -> bool {
        self.0.keep(b, h, q, kv) && self.1.keep(b, h, q, kv)
    }
    fn keep_row(&self, b: usize, h: usize, q: usize, kv0: usize, out: &mut [bool]) {
        let first = |k0, seg: &mut [bool]| self.0.keep_row(b, h, q, k0, seg);
        let second = |k0, seg: &mut [bool]| self.1.keep_row(b, h, q, k0, seg);
        combine_row(out, kv0, first, second, |x, y| x && y);
    }
    fn classify(&self, b: usize, h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        use BlockClass::*;
        match self.0.classify(b, h, qs.clone(), ks.clone()) {
            Empty => Empty,
            Full => self.1.classify(b, h, qs, ks),
            Partial => match self.1.classify(b, h, qs, ks) {
                Empty => Empty,
                _ => Partial,
            },
        }
    }
}

impl<A: MaskMod, B: MaskMod> MaskMod for Or<A, B> {
    fn keep(&self, b: usize, h: usize, q: usize, kv: usize) -> bool {
        self.0.keep(b, h, q, kv) || self.1.keep(b, h, q, kv)
    }
    fn keep_row(&self, b: usize, h: usize, q: usize, kv0: usize, out: &mut [bool]) {
        let first = |k0, seg: &mut [bool]| self.0.keep_row(b, h, q, k0, seg);
        let second = |k0, seg: &mut [bool]| self.1.keep_row(b, h, q, k0, seg);
        combine_row(out, kv0, first, second, |x, y| x || y);
    }
    fn classify(&self, b: usize, h: usize, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
        use BlockClass::*;
        match self.0.classify(b, h, qs.clone(), ks.clone()) {
            Full => Full,
            Empty => self.1.classify(b, h, qs, ks),
            Partial => match self.1.classify(b, h, qs, ks) {
                Full => Full,
                _ => Partial,
            },
        }
    }
}
