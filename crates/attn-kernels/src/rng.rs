//! SplitMix64, the workspace's one small seedable generator: its mixing function keys dropout rows
//! ([`crate::dropout`]), and its stream gives reproducible data to examples, benchmarks and
//! initialisation on every machine (candle's CPU generator cannot be seeded). Hidden from this
//! crate's documentation: other crates use it as `attn::random::SplitMix64`.

/// SplitMix64's output function of one state value.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The SplitMix64 stream from a seed.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream starting at `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The stream from `seed` after `index` draws: its values are those of `new(seed)` from the
    /// `index`-th on, so parts of one stream can be drawn apart (in parallel) and agree with it.
    pub fn at(seed: u64, index: u64) -> Self {
        Self(seed.wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let z = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z
    }

    /// Uniform in `[0, 1)` with 24 random bits (exact in `f32`).
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn uniform(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        self.uniform_iter(lo, hi).take(n).collect()
    }

    /// The endless stream of values uniform in `[lo, hi)` that [`uniform`](Self::uniform) takes
    /// from.
    pub fn uniform_iter(&mut self, lo: f32, hi: f32) -> impl Iterator<Item = f32> + '_ {
        std::iter::repeat_with(move || lo + (hi - lo) * self.unit_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_matches_the_published_splitmix64_values() {
        // First outputs of SplitMix64 seeded with 1234567 (Vigna's reference implementation).
        let mut g = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| g.next_u64()).collect();
        assert_eq!(got, [6457827717110365317, 3203168211198807973, 9817491932198370423]);
    }

    #[test]
    fn a_stream_from_an_index_continues_the_whole_stream() {
        let whole: Vec<u64> = {
            let mut g = SplitMix64::new(99);
            (0..40).map(|_| g.next_u64()).collect()
        };
        for index in [0, 1, 17, 39] {
            let mut g = SplitMix64::at(99, index);
            assert_eq!(g.next_u64(), whole[index as usize], "draw {index}");
        }
    }

    #[test]
    fn uniform_stays_in_range() {
        let xs = SplitMix64::new(7).uniform(10_000, -1.0, 1.0);
        assert!(xs.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
    }
}
