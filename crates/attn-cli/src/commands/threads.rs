//! The `--threads` flag of `attn run`, `attn bench` and `attn train`: the size of the rayon pool
//! the command computes in, all cores by default, at most [`MAX_THREADS`] (more threads than that
//! only oversubscribe any machine this runs on, and a typo such as `--threads 80000` would
//! otherwise try to start them all).

use anyhow::Context;

use super::sdpa_flags::number_in;

/// The most threads `--threads` accepts.
pub const MAX_THREADS: usize = 1024;

/// How many threads a command computes with.
#[derive(clap::Args, Debug, Clone)]
pub struct Threads {
    /// Threads of the pool the command computes in (default: all cores; at most 1024).
    #[arg(long = "threads", value_name = "N", allow_negative_numbers = true, value_parser = parse_threads)]
    pub count: Option<usize>,
}

impl Threads {
    /// The thread count: as given, or every core.
    pub fn get(&self) -> usize {
        self.count.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// A rayon pool of [`get`](Self::get) threads.
    pub fn pool(&self) -> anyhow::Result<rayon::ThreadPool> {
        let n = self.get();
        rayon::ThreadPoolBuilder::new().num_threads(n).build().with_context(|| format!("cannot start {n} threads"))
    }
}

fn parse_threads(s: &str) -> Result<usize, String> {
    let n = number_in(s, |n: i64| (1..=MAX_THREADS as i64).contains(&n), &format!("[1, {MAX_THREADS}]"))?;
    Ok(n as usize)
}
