//! Seeded draws shared by the task and the batch order: a generator keyed by `(seed, salt,
//! index)`, so each draw is a pure function of its key, a bounded integer, and Fisher–Yates.

use attn::random::{splitmix64, SplitMix64};

/// The generator for item `index` of the stream `salt` under `seed`; distinct keys give
/// independent-looking streams.
pub(crate) fn stream(seed: u64, salt: u64, index: u64) -> SplitMix64 {
    SplitMix64::new(splitmix64(splitmix64(seed ^ salt) ^ splitmix64(index)))
}

/// Uniform in `0..n` (`n > 0`), by the high half of a 64×64-bit product (bias below `n / 2⁶⁴`).
pub(crate) fn below(rng: &mut SplitMix64, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// Shuffles the first `k` positions of `items` (Fisher–Yates, stopped early): they become a
/// uniform random `k`-subset in random order; `k = items.len()` shuffles everything.
pub(crate) fn shuffle_prefix<T>(rng: &mut SplitMix64, items: &mut [T], k: usize) {
    let n = items.len();
    for i in 0..k.min(n) {
        let j = i + below(rng, n - i);
        items.swap(i, j);
    }
}
