//! The computations behind `attn explain`, the seed texts' textbook experiments; the command line
//! only parses flags, prints these results as tables and draws them:
//!
//! - [`scaling`]: why dot products are scaled by `1/√d_k` — the variance of `q·k` grows with
//!   `d_k`, and unscaled softmax saturates until its gradients vanish;
//! - [`heads`]: what each head of a trained translator attends to — mean attention distance and
//!   entropy per layer and head, and one example's weights;
//! - [`classify`]: a single-head self-attention classifier with padding masks, trained on a
//!   generated variable-length task that needs attention.
//!
//! Every experiment is a pure function of its settings and seed.

pub mod classify;
pub mod heads;
pub mod scaling;

/// The entropy `−Σ p·ln p` in nats of a probability row (`0·ln 0 = 0`).
pub fn entropy(p: impl IntoIterator<Item = f64>) -> f64 {
    -p.into_iter().filter(|&x| x > 0.0).map(|x| x * x.ln()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn entropy_of_uniform_and_one_hot_rows() {
        assert!((super::entropy([0.25; 4]) - 4f64.ln()).abs() < 1e-12);
        assert_eq!(super::entropy([0.0, 1.0, 0.0]), 0.0);
    }
}
