//! The timing loop: warm-up calls, then timed calls until the iteration cap or the time budget,
//! recording each call's wall time and the memory it allocated beyond its output.

use std::time::Instant;

use attn::SdpaOutput;

use crate::alloc_meter;

/// How many calls to make.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Untimed calls first.
    pub warmup: usize,
    /// Most timed calls.
    pub iters: usize,
    /// Stop timing early once this many seconds were spent and [`MIN_ITERS`] calls made.
    pub seconds: f64,
}

/// Timed calls made before the time budget may end a run (fewer if `iters` is smaller).
pub const MIN_ITERS: usize = 3;

/// The timings of one case.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Seconds per timed call, in call order.
    pub times: Vec<f64>,
    /// The most bytes any call held at once beyond the bytes of the output it returned.
    pub extra_bytes: u64,
}

impl Measurement {
    /// Median seconds per call (mean of the two middle ones for an even count).
    pub fn median(&self) -> f64 {
        let mut t = self.times.clone();
        t.sort_by(f64::total_cmp);
        let n = t.len();
        if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2.0
        }
    }

    /// Fastest call in seconds.
    pub fn min(&self) -> f64 {
        self.times.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Slowest call in seconds.
    pub fn max(&self) -> f64 {
        self.times.iter().copied().fold(0.0, f64::max)
    }
}

/// What a timed call returns: the bytes of it that are results, not scratch.
pub trait Held {
    /// Bytes the results hold.
    fn held_bytes(&self) -> usize;
}

/// A tensor is all result.
impl Held for candle_core::Tensor {
    fn held_bytes(&self) -> usize {
        self.elem_count() * self.dtype().size_in_bytes()
    }
}

/// An attention output holds `out`, `lse` and any weights.
impl Held for SdpaOutput {
    fn held_bytes(&self) -> usize {
        let tensors = [Some(&self.out), Some(&self.lse), self.weights.as_ref()];
        tensors.into_iter().flatten().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }
}

/// Runs `call` as `budget` says and measures it; `budget.iters` must be at least 1.
pub fn measure<O: Held>(budget: Budget, mut call: impl FnMut() -> anyhow::Result<O>) -> anyhow::Result<Measurement> {
    for _ in 0..budget.warmup {
        call()?;
    }
    let min_iters = MIN_ITERS.min(budget.iters);
    let mut times = Vec::with_capacity(budget.iters.min(1024));
    let mut extra_bytes = 0u64;
    let mut spent = 0.0;
    while times.len() < budget.iters && (spent < budget.seconds || times.len() < min_iters) {
        let base = alloc_meter::reset_peak();
        let start = Instant::now();
        let out = call()?;
        let t = start.elapsed().as_secs_f64();
        let held = alloc_meter::peak_bytes().saturating_sub(base);
        extra_bytes = extra_bytes.max(held.saturating_sub(out.held_bytes()) as u64);
        drop(out);
        times.push(t);
        spent += t;
    }
    Ok(Measurement { times, extra_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_output(n: usize) -> SdpaOutput {
        let zeros =
            |n: usize| candle_core::Tensor::zeros(n, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
        SdpaOutput { out: zeros(n), lse: zeros(1), weights: None }
    }

    #[test]
    fn statistics_of_the_times() {
        let m = Measurement { times: vec![4.0, 1.0, 3.0, 2.0], extra_bytes: 0 };
        assert_eq!((m.median(), m.min(), m.max()), (2.5, 1.0, 4.0));
        let m = Measurement { times: vec![5.0, 1.0, 3.0], extra_bytes: 0 };
        assert_eq!(m.median(), 3.0);
    }

    #[test]
    fn iteration_cap_and_budget() {
        let _meter = alloc_meter::exclusive();
        let mut calls = 0;
        let b = Budget { warmup: 2, iters: 5, seconds: f64::INFINITY };
        let m = measure(b, || {
            calls += 1;
            Ok(fake_output(4))
        })
        .unwrap();
        assert_eq!((calls, m.times.len()), (7, 5));
        let b = Budget { warmup: 0, iters: 100, seconds: 0.0 };
        assert_eq!(measure(b, || Ok(fake_output(4))).unwrap().times.len(), MIN_ITERS);
    }

    #[test]
    fn counts_scratch_memory_but_not_the_output() {
        let _meter = alloc_meter::exclusive();
        let b = Budget { warmup: 0, iters: 1, seconds: 0.0 };
        let m = measure(b, || {
            let out = fake_output(16 << 20);
            let scratch = std::hint::black_box(vec![1u8; 8 << 20]);
            drop(scratch);
            Ok(out)
        })
        .unwrap();
        // The 64 MiB output is not counted, the 8 MiB scratch is. The margins cover other tests
        // allocating or freeing meanwhile (they never reset the peak: `exclusive` orders that).
        assert!(m.extra_bytes >= 6 << 20, "{}", m.extra_bytes);
        assert!(m.extra_bytes < 32 << 20, "{}", m.extra_bytes);
    }

    #[test]
    fn errors_pass_through() {
        let _meter = alloc_meter::exclusive();
        let b = Budget { warmup: 1, iters: 1, seconds: 0.0 };
        assert!(measure::<SdpaOutput>(b, || anyhow::bail!("boom")).is_err());
    }
}
