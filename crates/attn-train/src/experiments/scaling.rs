//! Why scaled dot-product attention divides by `√d_k`. For query and key vectors with independent
//! unit-variance Gaussian entries, `q·k` is a sum of `d_k` products of variance 1, so its variance
//! is `d_k`: the logits a softmax sees grow like `√d_k`. Unscaled, the softmax saturates (one key
//! takes nearly all the weight, the entropy falls towards 0) and its Jacobian
//! `∂p/∂s = diag(p) − p·pᵀ` vanishes, so almost no gradient flows back to the queries and keys.
//! Scaled by `1/√d_k`, the logits keep unit variance whatever `d_k` is, and so do the entropy and
//! the gradient.
//!
//! For each `d_k`, each trial draws one query and `keys` keys (SplitMix64, Box–Muller), scores
//! them, and measures the softmax of the scores unscaled and scaled: its entropy and the Frobenius
//! norm of its Jacobian, in closed form `‖diag(p) − p·pᵀ‖²_F = Σp² − 2·Σp³ + (Σp²)²`. The results
//! are the sample variance of every score, the mean entropy, and the mean and the median of the
//! Jacobian norm over the trials: unscaled, the mean falls like `1/√d_k` (it is carried by the
//! rare trials whose two best keys nearly tie) while the median, the typical query, collapses
//! exponentially. Each `d_k` has its own stream keyed by `(seed, d_k)`, so a row
//! does not depend on which other sizes are measured.

use attn::random::{splitmix64, SplitMix64};

use super::entropy;
use crate::error::{Result, TrainError};

/// Gaussian numbers a run may draw before it is refused as too long (about a minute's work).
pub const MAX_DRAWS: u64 = 1 << 32;
/// The most trials per width (each keeps its two Jacobian norms for the medians).
pub const MAX_TRIALS: usize = 1_000_000;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingSettings {
    /// The key widths `d_k`.
    pub dims: Vec<usize>,
    /// Keys per query (the softmax's length).
    pub keys: usize,
    /// Queries per width.
    pub trials: usize,
    /// Seed of the draws.
    pub seed: u64,
}

impl Default for ScalingSettings {
    /// `d_k` = 4, 8, …, 1024; 16 keys; 2000 trials; seed 0.
    fn default() -> Self {
        Self { dims: (2..=10).map(|p| 1 << p).collect(), keys: 16, trials: 2000, seed: 0 }
    }
}

impl ScalingSettings {
    /// Refuses settings that measure nothing or would run too long, naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::Setting { field, reason });
        if self.dims.is_empty() || self.dims.contains(&0) {
            return bad("dims", format!("{:?}: give at least one width, all positive", self.dims));
        }
        if self.keys < 2 {
            return bad("keys", format!("{}: a softmax over fewer than 2 keys is constant", self.keys));
        }
        if !(2..=MAX_TRIALS).contains(&self.trials) {
            return bad(
                "trials",
                format!("{}: need at least 2 (for a sample variance) and at most {MAX_TRIALS}", self.trials),
            );
        }
        let per_trial = (self.keys as u64 + 1).saturating_mul(self.dims.iter().map(|&d| d as u64).sum());
        let draws = per_trial.saturating_mul(self.trials as u64);
        if draws > MAX_DRAWS {
            return bad(
                "trials",
                format!(
                    "trials × (keys + 1) × the sum of dims = {draws} Gaussian draws, over the limit \
                     {MAX_DRAWS}; lower one of them"
                ),
            );
        }
        Ok(())
    }
}

/// One softmax's statistics over the trials. The Jacobian `∂p/∂s` is taken with respect to the
/// logits the softmax sees; its Frobenius norm is at most `1/√2`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxStats {
    /// Mean entropy in nats (at most `ln keys`).
    pub entropy: f64,
    /// Mean Frobenius norm of the Jacobian.
    pub jacobian_mean: f64,
    /// Median Frobenius norm of the Jacobian.
    pub jacobian_median: f64,
}

/// One width's measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScalingRow {
    /// The key width.
    pub d_k: usize,
    /// Sample variance of the raw scores `q·k` (≈ `d_k`).
    pub score_variance: f64,
    /// The softmax of `q·k`.
    pub unscaled: SoftmaxStats,
    /// The softmax of `q·k / √d_k`.
    pub scaled: SoftmaxStats,
}

/// Runs the measurement for every width of `settings`, in order.
pub fn run(settings: &ScalingSettings) -> Result<Vec<ScalingRow>> {
    settings.check()?;
    Ok(settings.dims.iter().map(|&d| measure(d, settings)).collect())
}

/// Unit-variance Gaussian numbers by Box–Muller, both numbers of each pair used.
struct Gaussian {
    rng: SplitMix64,
    spare: Option<f64>,
}

impl Gaussian {
    fn next(&mut self) -> f64 {
        if let Some(x) = self.spare.take() {
            return x;
        }
        let radius = (-2.0 * (1.0 - self.rng.unit_f64()).ln()).sqrt(); // 1 − u is in (0, 1]
        let (sin, cos) = (std::f64::consts::TAU * self.rng.unit_f64()).sin_cos();
        self.spare = Some(radius * sin);
        radius * cos
    }

    fn vector(&mut self, out: &mut [f64]) {
        out.iter_mut().for_each(|x| *x = self.next());
    }
}

/// Accumulates [`SoftmaxStats`] over trials.
#[derive(Default)]
struct Sums {
    entropy: f64,
    jacobian_norms: Vec<f64>,
}

impl Sums {
    /// Adds the softmax of `logits` (overwritten by the weights).
    fn add(&mut self, logits: &mut [f64]) {
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        logits.iter_mut().for_each(|s| *s = (*s - max).exp());
        let total: f64 = logits.iter().sum();
        logits.iter_mut().for_each(|p| *p /= total);
        let (s2, s3) = logits.iter().fold((0.0, 0.0), |(s2, s3), p| (s2 + p * p, s3 + p * p * p));
        self.entropy += entropy(logits.iter().copied());
        self.jacobian_norms.push((s2 - 2.0 * s3 + s2 * s2).max(0.0).sqrt());
    }

    fn stats(mut self) -> SoftmaxStats {
        let n = self.jacobian_norms.len();
        let mean = self.jacobian_norms.iter().sum::<f64>() / n as f64;
        self.jacobian_norms.sort_by(f64::total_cmp);
        let j = &self.jacobian_norms;
        let median = if n % 2 == 1 { j[n / 2] } else { (j[n / 2 - 1] + j[n / 2]) / 2.0 };
        SoftmaxStats { entropy: self.entropy / n as f64, jacobian_mean: mean, jacobian_median: median }
    }
}

fn measure(d_k: usize, s: &ScalingSettings) -> ScalingRow {
    let mut gauss = Gaussian { rng: SplitMix64::new(splitmix64(s.seed ^ splitmix64(d_k as u64))), spare: None };
    let (mut q, mut k) = (vec![0.0; d_k], vec![0.0; d_k]);
    let mut scores = vec![0.0; s.keys];
    let mut scaled_scores = vec![0.0; s.keys];
    let (mut unscaled, mut scaled) = (Sums::default(), Sums::default());
    let (mut sum, mut sum_sq) = (0.0, 0.0);
    let scale = 1.0 / (d_k as f64).sqrt();
    for _ in 0..s.trials {
        gauss.vector(&mut q);
        for score in scores.iter_mut() {
            gauss.vector(&mut k);
            *score = q.iter().zip(&k).map(|(a, b)| a * b).sum();
            sum += *score;
            sum_sq += *score * *score;
        }
        scaled_scores.iter_mut().zip(&scores).for_each(|(t, s)| *t = s * scale);
        unscaled.add(&mut scores);
        scaled.add(&mut scaled_scores);
    }
    let n = (s.trials * s.keys) as f64;
    let score_variance = (sum_sq - sum * sum / n) / (n - 1.0);
    ScalingRow { d_k, score_variance, unscaled: unscaled.stats(), scaled: scaled.stats() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dims: &[usize], trials: usize) -> ScalingSettings {
        ScalingSettings { dims: dims.to_vec(), keys: 16, trials, seed: 3 }
    }

    #[test]
    fn the_score_variance_is_d_k() {
        for row in run(&settings(&[4, 64, 1024], 500)).unwrap() {
            let ratio = row.score_variance / row.d_k as f64;
            assert!((ratio - 1.0).abs() < 0.1, "d_k {}: variance {}", row.d_k, row.score_variance);
        }
    }

    #[test]
    fn unscaled_gradients_vanish_as_d_k_grows_and_scaled_ones_do_not() {
        let rows = run(&settings(&[4, 16, 64, 256, 1024], 1000)).unwrap();
        for (i, pair) in rows.windows(2).enumerate() {
            let (a, b) = (pair[0].unscaled, pair[1].unscaled);
            assert!(b.jacobian_mean < a.jacobian_mean && b.entropy < a.entropy, "{pair:?}");
            // At small widths a sharper softmax can still have a larger Jacobian (uniform weights
            // give less than a two-way tie); from d_k = 16 on the typical one only shrinks.
            assert!(i == 0 || b.jacobian_median < a.jacobian_median, "{pair:?}");
        }
        let last = rows.last().unwrap();
        assert!(last.unscaled.jacobian_mean < 0.25 * last.scaled.jacobian_mean, "{last:?}");
        assert!(last.unscaled.jacobian_median < 1e-3 * last.scaled.jacobian_median, "{last:?}");
        assert!(last.unscaled.entropy < 0.2, "{last:?}");
        // Scaled, the logits have unit variance at every width: the statistics hardly move.
        let (first, last) = (rows[0].scaled, last.scaled);
        assert!((first.jacobian_mean / last.jacobian_mean - 1.0).abs() < 0.15, "{first:?} vs {last:?}");
        assert!((first.entropy / last.entropy - 1.0).abs() < 0.15, "{first:?} vs {last:?}");
        assert!(rows.iter().all(|r| r.scaled.entropy <= 16f64.ln() && r.scaled.jacobian_median > 0.0));
    }

    #[test]
    fn rows_are_seeded_per_width() {
        let both = run(&settings(&[8, 32], 50)).unwrap();
        let alone = run(&settings(&[32], 50)).unwrap();
        assert_eq!(both[1], alone[0]);
        assert_ne!(run(&ScalingSettings { seed: 4, ..settings(&[32], 50) }).unwrap()[0], alone[0]);
    }

    #[test]
    fn the_jacobian_norm_matches_the_matrix() {
        let mut p = vec![0.3f64.ln(), 0.5f64.ln(), 0.2f64.ln()];
        let mut sums = Sums::default();
        sums.add(&mut p);
        let frob: f64 = (0..3)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| (if i == j { p[i] } else { 0.0 } - p[i] * p[j]).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((sums.jacobian_norms[0] - frob).abs() < 1e-12);
    }

    #[test]
    fn settings_are_checked_by_field() {
        let err = |s: ScalingSettings| run(&s).unwrap_err().to_string();
        assert!(err(settings(&[], 10)).starts_with("dims"));
        assert!(err(settings(&[4, 0], 10)).starts_with("dims"));
        assert!(err(ScalingSettings { keys: 1, ..settings(&[4], 10) }).starts_with("keys"));
        assert!(err(settings(&[4], 1)).starts_with("trials"));
        assert!(err(settings(&[4], MAX_TRIALS + 1)).starts_with("trials"));
        assert!(err(settings(&[1 << 20], 1 << 10)).contains("Gaussian draws"));
    }
}
