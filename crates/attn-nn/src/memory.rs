//! The process allocator's policy for training and benchmarking: candle gives every operation a
//! fresh output buffer, and glibc serves each buffer above its mmap threshold (128 KiB at first,
//! growing with use) with a new mapping that is returned to the system when freed. Every forward
//! and backward then pays a page fault and a kernel zeroing per 4 KiB of each activation, a large
//! share of a step's time. Serving every buffer from the heap (no mmap) and trimming the heap only
//! beyond 1 GiB keeps freed buffers for the next step, at the same peak resident memory (see
//! docs/performance-log.md, "attn-nn/src/memory.rs: module doc").
//!
//! This is process-wide, so a library does not decide it: binaries call [`reuse_freed_buffers`]
//! once at start. On targets without glibc it does nothing. The `attn` command and the
//! benchmarks go further: their Rust allocations go through mimalloc, which keeps freed memory
//! itself (faster again: the same log entry), and this setting covers what still reaches glibc.

/// Asks glibc's malloc to serve large buffers from its heap and keep them there when freed, for
/// reuse, instead of mapping and unmapping each one.
/// Returns whether the allocator took the setting (`false` where the target has no glibc).
pub fn reuse_freed_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        /// Freed memory at the top of the heap is returned to the system only beyond this.
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: `mallopt` only changes allocator parameters; it is safe to call at any time,
        // including while other threads allocate (glibc takes its own locks).
        unsafe { libc::mallopt(libc::M_MMAP_MAX, 0) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn glibc_takes_the_setting() {
        assert!(super::reuse_freed_buffers());
    }
}
