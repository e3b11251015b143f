//! What a forward call returns ([`AttnOutput`], from every kernel) and the flash path that scored
//! its keys ([`Path`]), which the backward is handed back ([`Saved`](crate::Saved)) so that it
//! scores them the same way.

use crate::alloc::{self, AllocError, ZeroBits};
use crate::problem::Dims;

/// How the flash kernels cut a call's work (and so how they score its keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Packed keys, blocks of one head's queries.
    Prefill,
    /// Keys read in place, every query head of a group stacked.
    Decode,
}

/// Results of one attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnOutput<T> {
    /// `[B, Hq, Lq, Dv]`.
    pub out: Vec<T>,
    /// Natural log-sum-exp of the scores per row, `[B, Hq, Lq]`; −∞ for a fully masked row. With
    /// [sinks](crate::AttnParams::sinks) it includes the row's sink, `logaddexp(lse_keys, sink_h)`
    /// (`sink_h` for a fully masked row).
    pub lse: Vec<T>,
    /// The rounding residue of each `lse` (the exact log-sum-exp is `lse + lse_residue` up to a few
    /// ulps of `ln Σ exp(s − max)`), `[B, Hq, Lq]`; 0 where `lse` is not finite. Hand it to the
    /// backward ([`Saved::lse_residue`](crate::Saved)) so that its probabilities are as accurate as
    /// the forward's.
    pub lse_residue: Vec<T>,
    /// Softmax weights before dropout, `[B, Hq, Lq, Lk]`, when asked for (with sinks a row sums to
    /// `1 − exp(sink_h − lse)`).
    pub weights: Option<Vec<T>>,
    /// The flash path that scored the keys (`None`: the reference kernel). The backward scores them
    /// the same way ([`Saved::forward_path`](crate::Saved)), so that its `S` is bit for bit the
    /// forward's and `P = exp(S − lse)` matches the forward's log-sum-exp.
    pub path: Option<Path>,
}

impl<T: ZeroBits> AttnOutput<T> {
    /// The result buffers of a call of sizes `d`, allocated fallibly (weights first, the largest):
    /// output, weights and residues zero ([`alloc::zeroed`]: large ones populated in parallel, no
    /// writing pass), log-sum-exp `lse`.
    pub(crate) fn alloc(d: &Dims, want_weights: bool, lse: T) -> Result<Self, AllocError> {
        let weights = if want_weights { Some(alloc::zeroed("attention weights", &d.weights_shape())?) } else { None };
        Ok(Self {
            out: alloc::zeroed("attention output", &d.out_shape())?,
            lse: alloc::filled("log-sum-exp", &d.lse_shape(), lse)?,
            lse_residue: alloc::zeroed("log-sum-exp residue", &d.lse_shape())?,
            weights,
            path: None,
        })
    }
}
