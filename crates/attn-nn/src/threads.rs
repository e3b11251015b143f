//! The threads candle uses on the CPU. Its matrix products split their work into
//! `RAYON_NUM_THREADS` parts (default: all cores) and the attention kernels run in the current
//! rayon pool; its element-wise ops run in a separate pool of `CANDLE_NUM_THREADS` threads, which
//! [`quiet_candle_pool`] sets to one. Process-wide, like [`crate::memory`]: binaries (the `attn`
//! command, the benchmarks) call it at start. [`on_workers`] runs a binary's work on a rayon
//! pool's own thread, as the `attn` command runs each command.

/// Sets `CANDLE_NUM_THREADS=1` unless the user set it; call it first in `main`, before any
/// tensor work (candle reads the variable once). candle's element-wise pool spins while it waits
/// for work; on the small tensors of the modules and the translator that costs several times the
/// work itself on a 2-core machine (see docs/performance-log.md,
/// "attn-nn/src/threads.rs: quiet_candle_pool"). Matrix products and the attention kernels keep
/// their own threads.
pub fn quiet_candle_pool() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// Runs `f` on one thread of a rayon pool of `RAYON_NUM_THREADS` threads (default: every core, as
/// candle counts them), so that every parallel step inside it (matrix products, attention
/// kernels, fused ops) is split with work stealing from that thread instead of being handed from
/// an outside thread to the pool and waited for: the caller works rather than sleeping, and
/// a step costs no wake-up of it (measured on the translator's training steps: see
/// docs/performance-log.md, "Modules and training steps after the fused ops"). An error starting
/// the threads is returned as is.
pub fn on_workers<R: Send>(f: impl FnOnce() -> R + Send) -> Result<R, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(candle_core::utils::get_num_threads()).build()?;
    Ok(pool.install(f))
}
