//! `attn bench --pattern`: the pattern's block mask for one case, built once before timing (as a
//! model builds it once for every call and layer) and its building timed on its own, with what the
//! report gives about it: the mask's own density and bytes.

use std::sync::Arc;

use attn::sparse::{BlockMask, Pattern};
use attn_kernels::Dims;

use crate::commands::sdpa_flags::pattern_error;
use crate::measure::{self, Budget, Held, Measurement};

/// A case's block mask and the timing of its building.
pub struct Sparse {
    /// The pattern.
    pub pattern: Pattern,
    /// The mask, shared by the timed calls.
    pub mask: Arc<BlockMask>,
    /// Building times (its `extra_bytes` unused: the mask's size is [`BlockMask::bytes`]).
    pub build: Measurement,
}

impl Held for BlockMask {
    fn held_bytes(&self) -> usize {
        self.bytes()
    }
}

/// Calls to time the building with, at most, and the seconds after which to stop (once 3 were
/// made).
const BUILD_BUDGET: Budget = Budget { warmup: 0, iters: 10, seconds: 0.5 };

impl Sparse {
    /// Builds `pattern`'s block mask for `dims`' `Lq × Lk` in `pool`, timing it; a pattern that
    /// does not fit the sizes is refused naming its flag.
    pub fn build(pattern: &Pattern, dims: &Dims, pool: &rayon::ThreadPool) -> anyhow::Result<Self> {
        let make = || pool.install(|| pattern.block_mask(dims.lq, dims.lk)).map_err(pattern_error);
        let mask = Arc::new(make()?);
        let build = measure::measure(BUILD_BUDGET, make)?;
        Ok(Self { pattern: pattern.clone(), mask, build })
    }
}
