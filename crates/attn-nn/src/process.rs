//! The process-wide settings a binary running these modules wants at start, in one call:
//! candle's element-wise pool quieted ([`crate::threads`]) and freed buffers kept for reuse
//! ([`crate::memory`]).

/// Applies [`crate::threads::quiet_candle_pool`] and [`crate::memory::reuse_freed_buffers`];
/// call it first in `main`, before any tensor work.
pub fn setup() {
    crate::threads::quiet_candle_pool();
    crate::memory::reuse_freed_buffers();
}
