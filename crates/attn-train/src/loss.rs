//! The training loss: token-level cross-entropy of the logits against the targets, ignoring
//! padding (PyTorch's `cross_entropy(ignore_index=pad)`, mean over the real tokens), built from
//! differentiable candle ops.

use candle_core::{DType, Tensor, D};

use crate::error::Result;

/// `logits: [B, L, V]`, `targets: [B, L]` (`U32`) → the mean negative log-likelihood of the
/// targets that are not `pad` (a scalar), and how many there were. Packed batches pass
/// `logits: [total, V]`, `targets: [total]` (no `pad` among them).
pub fn masked_cross_entropy(logits: &Tensor, targets: &Tensor, pad: u32) -> Result<(Tensor, usize)> {
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?; // [B, L, V]
    let picked = log_probs.gather(&targets.unsqueeze(D::Minus1)?.contiguous()?, D::Minus1)?.squeeze(D::Minus1)?; // [B, L]
    let real = targets.ne(pad)?.to_dtype(DType::F32)?; // [B, L]
    let count = real.sum_all()?.to_scalar::<f32>()? as usize;
    let loss = ((picked * &real)?.sum_all()?.neg()? / count.max(1) as f64)?;
    Ok((loss, count))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_the_formula_and_ignores_padding() {
        let dev = Device::Cpu;
        let logits = Tensor::new(&[[[2f32, 0.0, -1.0], [0.5, 0.5, 0.5], [9.0, -9.0, 3.0]]], &dev).unwrap();
        let targets = Tensor::new(&[[0u32, 2, 1]], &dev).unwrap(); // the last is padding (pad = 1)
        let (loss, count) = masked_cross_entropy(&logits, &targets, 1).unwrap();
        let nll0 = -(2f64.exp() / (2f64.exp() + 1.0 + (-1f64).exp())).ln();
        let nll1 = 3f64.ln();
        assert_eq!(count, 2);
        assert!((f64::from(loss.to_scalar::<f32>().unwrap()) - (nll0 + nll1) / 2.0).abs() < 1e-6);
    }
}
