//! What the delta rule's suites share: a call's owned inputs ([`Case`], drawn at random), their
//! `f32` rounding, and the largest difference from the `f64` oracle.

use attn_kernels::delta::{delta_rule_reference, DeltaDims, DeltaInputs, DeltaParams};
use attn_kernels::rng::SplitMix64;

/// Owned inputs of a call.
#[derive(Clone)]
pub struct Case {
    pub d: DeltaDims,
    pub p: DeltaParams,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub g: Vec<f64>,
    pub beta: Vec<f64>,
    pub init: Option<Vec<f64>>,
    pub cu: Option<Vec<usize>>,
}

impl Case {
    pub fn random(d: DeltaDims, p: DeltaParams, init: bool, seed: u64) -> Case {
        let mut rng = SplitMix64::new(seed);
        let mut uniform =
            |n: usize, lo: f64, hi: f64| -> Vec<f64> { (0..n).map(|_| lo + (hi - lo) * rng.unit_f64()).collect() };
        Case {
            q: uniform(d.qk_len(), -1.0, 1.0),
            k: uniform(d.qk_len(), -1.0, 1.0),
            v: uniform(d.v_len(), -1.0, 1.0),
            g: uniform(d.g_len(p.gate), -0.7, -0.05),
            beta: uniform(d.beta_len(), 0.1, 0.9),
            init: init.then(|| uniform(d.state_len(d.b), -0.5, 0.5)),
            cu: None,
            d,
            p,
        }
    }

    pub fn inputs(&self) -> DeltaInputs<'_, f64> {
        DeltaInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.init.as_deref(),
            cu_seqlens: self.cu.as_deref(),
        }
    }

    /// `Σ wo·o + Σ wf·final`: a scalar whose gradient is `(wo, wf)` through the outputs.
    pub fn loss(&self, wo: &[f64], wf: &[f64]) -> f64 {
        let o = delta_rule_reference(&self.d, &self.inputs(), &self.p).unwrap();
        o.out.iter().zip(wo).map(|(a, b)| a * b).sum::<f64>()
            + o.final_state.iter().zip(wf).map(|(a, b)| a * b).sum::<f64>()
    }
}

pub fn dims(b: usize, t: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> DeltaDims {
    DeltaDims { b, t, hk, hv, dk, dv }
}

/// `x` rounded to f32.
pub fn f32s(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// `x` widened to f64.
pub fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// The largest difference of `a` from `b`.
pub fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (*x as f64 - y).abs()).fold(0.0, f64::max)
}
