//! The learning-rate schedule: linear warm-up to the peak over `warmup` steps, then cosine decay to
//! `floor · peak` at the last step.

use crate::settings::TrainSettings;

/// Warm-up then cosine decay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The rate reached after warm-up.
    pub peak: f64,
    /// Warm-up steps.
    pub warmup: u64,
    /// Total steps of the run.
    pub total: u64,
    /// The final rate as a fraction of the peak.
    pub floor: f64,
}

impl Schedule {
    /// The schedule of a training run: warm-up and peak from `train`, decay to a tenth of the
    /// peak at its last step.
    pub fn of_run(train: &TrainSettings) -> Self {
        Self { peak: train.lr, warmup: train.warmup, total: train.steps, floor: 0.1 }
    }

    /// The rate of step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.peak * (self.floor + (1.0 - self.floor) * cosine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_to_the_floor() {
        let s = Schedule { peak: 1e-3, warmup: 10, total: 110, floor: 0.1 };
        assert!((s.lr(0) - 1e-4).abs() < 1e-12 && (s.lr(9) - 1e-3).abs() < 1e-12);
        assert!((s.lr(10) - 1e-3).abs() < 1e-12);
        assert!((s.lr(60) - 0.55e-3).abs() < 1e-12, "half-way: mean of peak and floor");
        assert!((s.lr(110) - 1e-4).abs() < 1e-12 && (s.lr(500) - 1e-4).abs() < 1e-12);
        assert!((10..110).all(|t| s.lr(t + 1) <= s.lr(t)));
    }
}
