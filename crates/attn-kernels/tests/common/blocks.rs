//! The class of a block of a mask, counted from its elements (the truth a block mask's class is
//! checked against).

use std::ops::Range;

use attn_kernels::{BlockClass, MaskMod};

/// The class of block `qs × ks` of `m` for batch entry 0, head 0, from its elements.
pub fn block_truth(m: &dyn MaskMod, qs: Range<usize>, ks: Range<usize>) -> BlockClass {
    let n = qs.len() * ks.len();
    let kept = qs.flat_map(|i| ks.clone().map(move |j| (i, j))).filter(|&(i, j)| m.keep(0, 0, i, j)).count();
    BlockClass::of(kept > 0, kept == n)
}
