//! The named sparse patterns of the literature, each a [`Pattern`] with its parameters that builds
//! its predicate ([`Pattern::mask_mod`]) and block mask ([`Pattern::block_mask`]) from the
//! primitives of `patterns`, united as its paper defines it:
//! - **strided** and **fixed**: Sparse Transformer (Child et al. 2019, "Generating Long Sequences
//!   with Sparse Transformers", §4.2), causal, O(n√n) with a stride near √n;
//! - **longformer**: Longformer (Beltagy et al. 2020), a sliding window ∪ global tokens (their rows
//!   and their columns);
//! - **bigbird**: BigBird (Zaheer et al. 2020), window ∪ global ∪ seeded random key blocks per
//!   query block;
//! - **document**: packed sequences, causal inside each document (FlexAttention's document mask);
//! - **prefix-lm**: a bidirectional prefix, causal after it (T5 / UniLM's prefix LM);
//! - **sinks**: StreamingLLM (Xiao et al. 2023), causal, the first tokens (attention sinks) ∪ a
//!   window of recent keys.
//!
//! Windows here are around the top-left diagonal (query `i` with key `i`), for self-attention.

use std::sync::Arc;

use super::patterns::{Band, Documents, GlobalKeys, GlobalQueries, PrefixLm, RandomBlocks, SameChunk};
use super::patterns::{StrideColumns, SummaryColumns};
use super::{BlockMask, BlockShape, MaskMod, MaskModExt};
use crate::error::{AttnError, Result};
use crate::mask::{Align, Window};

/// A named pattern and its parameters (see the module header for the sources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Causal; the previous `stride` positions and every `stride`-th one before them.
    Strided {
        /// Stride `l` (about √n).
        stride: usize,
    },
    /// Causal; the query's own chunk of `stride` positions and the last `summary` positions of
    /// every earlier chunk.
    Fixed {
        /// Chunk length `l`.
        stride: usize,
        /// Summary positions per chunk (`c` in the paper).
        summary: usize,
    },
    /// A sliding window ∪ the first `global` tokens' rows and columns.
    Longformer {
        /// Keys before and after the diagonal.
        window: Window,
        /// Global tokens.
        global: usize,
    },
    /// Longformer's parts ∪ `random` key blocks per query block drawn from `seed`.
    BigBird {
        /// Keys before and after the diagonal.
        window: Window,
        /// Global tokens.
        global: usize,
        /// Random key blocks per query block.
        random: usize,
        /// Seed of the random blocks.
        seed: u64,
    },
    /// Causal attention inside each packed document; `lengths` must sum to the sequence length.
    Document {
        /// Document lengths in order.
        lengths: Vec<usize>,
    },
    /// A bidirectional prefix of `prefix` tokens, causal after it.
    PrefixLm {
        /// Prefix length.
        prefix: usize,
    },
    /// Causal; the first `sinks` tokens ∪ the last `window` keys up to the query.
    Sinks {
        /// Sink tokens.
        sinks: usize,
        /// Recent keys, the query's own included.
        window: usize,
    },
}

impl Pattern {
    /// The pattern's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            Pattern::Strided { .. } => "strided",
            Pattern::Fixed { .. } => "fixed",
            Pattern::Longformer { .. } => "longformer",
            Pattern::BigBird { .. } => "bigbird",
            Pattern::Document { .. } => "document",
            Pattern::PrefixLm { .. } => "prefix-lm",
            Pattern::Sinks { .. } => "sinks",
        }
    }

    /// Checks the parameters against a self-attention of length `lq × lk`.
    pub fn check(&self, lq: usize, lk: usize) -> Result<()> {
        let bad = |field, reason: String| Err(AttnError::Param { field, reason });
        match self {
            Pattern::Strided { stride: 0 } | Pattern::Fixed { stride: 0, .. } => {
                bad("stride", "0, expected at least 1".into())
            }
            Pattern::Fixed { stride, summary } if summary > stride || *summary == 0 => {
                bad("summary", format!("{summary}, expected 1 to the stride {stride}"))
            }
            Pattern::Sinks { window: 0, .. } => bad("window", "0, expected at least 1 key".into()),
            Pattern::Document { lengths } if lq != lk || lengths.iter().sum::<usize>() != lq => {
                let total: usize = lengths.iter().sum();
                bad(
                    "doc_lengths",
                    format!("they sum to {total}, expected the sequence length {lq} (and {lk} keys alike)"),
                )
            }
            _ => Ok(()),
        }
    }

    /// The pattern's predicate for `lq` queries over `lk` keys.
    pub fn mask_mod(&self, lq: usize, lk: usize) -> Result<Arc<dyn MaskMod>> {
        self.check(lq, lk)?;
        let band = |causal, window| Band::new(causal, Some(window), Align::TopLeft, lq, lk);
        let longformer = |window, global| band(false, window).or(GlobalKeys(global)).or(GlobalQueries(global));
        let recent = |n: usize| Window { left: Some(n - 1), right: None };
        Ok(match self {
            Pattern::Strided { stride } => Arc::new(band(true, recent(*stride)).or(StrideColumns(*stride))),
            Pattern::Fixed { stride, summary } => {
                Arc::new(SameChunk(*stride).or(SummaryColumns { n: *stride, c: *summary }))
            }
            Pattern::Longformer { window, global } => Arc::new(longformer(*window, *global)),
            Pattern::BigBird { window, global, random, seed } => {
                Arc::new(longformer(*window, *global).or(RandomBlocks::new(*random, *seed, lq, lk)))
            }
            Pattern::Document { lengths } => Arc::new(Documents::new(lengths, true)),
            Pattern::PrefixLm { prefix } => Arc::new(PrefixLm(*prefix)),
            Pattern::Sinks { sinks, window } => {
                let causal = Band::new(true, None, Align::TopLeft, lq, lk);
                Arc::new(band(true, recent(*window)).or(GlobalKeys(*sinks).and(causal)))
            }
        })
    }

    /// The pattern's block mask for `lq` queries over `lk` keys, the same for every batch entry
    /// and head.
    pub fn block_mask(&self, lq: usize, lk: usize) -> Result<BlockMask> {
        BlockMask::build(BlockShape { batch: 1, heads: 1, lq, lk }, self.mask_mod(lq, lk)?)
    }
}
