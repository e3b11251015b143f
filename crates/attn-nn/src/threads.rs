//! The threads candle uses on the CPU. Its matrix products split their work into
//! `RAYON_NUM_THREADS` parts (default: all cores) and the attention kernels run in the current
//! rayon pool; its element-wise ops run in a separate pool of `CANDLE_NUM_THREADS` threads, which
//! [`quiet_candle_pool`] sets to one. Process-wide, like [`crate::memory`]: binaries (the `attn`
//! command, the benchmarks) call it at start.

/// Sets `CANDLE_NUM_THREADS=1` unless the user set it; call it first in `main`, before any
/// tensor work (candle reads the variable once). candle's element-wise pool spins while it waits
/// for work; on the small tensors of the modules and the translator that costs several times the
/// work itself on a 2-core machine (measured: 20 training steps in 16.5 s with it, 3.7 s
/// without). Matrix products and the attention kernels keep their own threads.
pub fn quiet_candle_pool() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
