//! The block-sparse pattern flags of `attn run` and `attn bench` (part of their attention flags):
//! `--pattern NAME` and the pattern's own parameters, made into an [`attn::sparse::Pattern`] by
//! the library ([`PatternParts::pattern`]); `--window` and `--seed` are the shared attention
//! flags', which a pattern with a window or random blocks takes as its own. A refusal is the
//! library's; `sdpa_flags::pattern_error` names the flag.

use attn::sparse::{Pattern, PatternParts, PATTERN_NAMES};
use attn::{AttnError, Window};
use clap::builder::PossibleValuesParser;

/// `--pattern` and its parameters.
#[derive(clap::Args, Debug, Clone)]
pub struct PatternFlags {
    /// Block-sparse pattern (the kernels visit only its 64×64 blocks), with its parameters:
    /// strided (--stride), fixed (--stride, --summary), longformer (--window, --global), bigbird
    /// (--window, --global, --random, --seed), document (--doc-lengths), prefix-lm (--prefix),
    /// sinks (--sink-tokens, --window LEFT,0). Windows are around the top-left diagonal. Within a
    /// pattern these are its parts, united as the pattern defines them; --causal, a --window the
    /// pattern does not take and the other masks compose with it by AND.
    #[arg(long, value_name = "NAME", value_parser = PossibleValuesParser::new(PATTERN_NAMES))]
    pub pattern: Option<String>,
    /// Global tokens G (longformer, bigbird): the first G tokens attend to and are attended by
    /// every token.
    #[arg(long, value_name = "G", requires = "pattern")]
    pub global: Option<usize>,
    /// Random key blocks R per query block (bigbird), drawn from --seed.
    #[arg(long, value_name = "R", requires = "pattern")]
    pub random: Option<usize>,
    /// Stride S (strided: the previous S positions and every S-th one before; fixed: chunks of S).
    #[arg(long, value_name = "S", requires = "pattern")]
    pub stride: Option<usize>,
    /// Summary positions C at the end of each chunk (fixed), 1 to the stride.
    #[arg(long, value_name = "C", requires = "pattern")]
    pub summary: Option<usize>,
    /// Document lengths a,b,c summing to the sequence length (document: causal inside each).
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', requires = "pattern")]
    pub doc_lengths: Option<Vec<usize>>,
    /// Prefix length P (prefix-lm: a bidirectional prefix, causal after it).
    #[arg(long, value_name = "P", requires = "pattern")]
    pub prefix: Option<usize>,
    /// Sink tokens N (sinks, StreamingLLM): the first N tokens, seen by every later query beside
    /// the recent --window LEFT,0.
    #[arg(long, value_name = "N", requires = "pattern")]
    pub sink_tokens: Option<usize>,
}

impl PatternFlags {
    /// The pattern asked for with the shared flags' `window` and `seed`, its parameters checked
    /// (its sizes are checked when its block mask is built); `None` without `--pattern`.
    pub fn pattern(&self, window: Option<Window>, seed: Option<u64>) -> Result<Option<Pattern>, AttnError> {
        let Some(name) = &self.pattern else { return Ok(None) };
        let parts = PatternParts {
            window,
            global: self.global,
            random: self.random,
            seed,
            stride: self.stride,
            summary: self.summary,
            doc_lengths: self.doc_lengths.clone(),
            prefix: self.prefix,
            sink_tokens: self.sink_tokens,
        };
        parts.pattern(name).map(Some)
    }
}
