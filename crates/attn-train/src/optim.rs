//! AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's `torch.optim.AdamW`
//! update), global-norm gradient clipping (PyTorch's `clip_grad_norm_`), and the optimiser state
//! as named tensors so a checkpoint can restore it exactly. candle-nn's `AdamW` keeps its moments
//! private, so a resumed run could not continue the same trajectory; this one exposes them.
//!
//! Weight decay applies to matrices (rank ≥ 2: projections, embeddings) and not to biases or
//! LayerNorm parameters, as is usual for Transformers.

use std::collections::{BTreeMap, HashMap};

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::error::{Result, TrainError};

/// AdamW's hyper-parameters (PyTorch's defaults except the learning rate, which the schedule sets
/// each step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay of matrices.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// One parameter and its moments.
struct Slot {
    var: Var,
    m: Tensor,
    v: Tensor,
}

/// The optimiser over a fixed, named set of variables.
pub struct AdamW {
    cfg: AdamWConfig,
    /// By name, so the state saves and loads by name.
    slots: BTreeMap<String, Slot>,
    /// Updates made.
    step: u64,
}

impl AdamW {
    /// Zero moments for `vars` (by name).
    pub fn new(vars: HashMap<String, Var>, cfg: AdamWConfig) -> Result<Self> {
        let slots = vars
            .into_iter()
            .map(|(name, var)| {
                let zeros = var.as_tensor().zeros_like()?;
                Ok((name, Slot { var, m: zeros.clone(), v: zeros }))
            })
            .collect::<Result<_>>()?;
        Ok(Self { cfg, slots, step: 0 })
    }

    /// Updates made so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// One update with learning rate `lr` from `grads`; a variable without a gradient is left
    /// unchanged (its moments too).
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<()> {
        self.step += 1;
        let c = self.cfg;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for slot in self.slots.values_mut() {
            let Some(g) = grads.get(slot.var.as_tensor()) else { continue };
            slot.m = ((&slot.m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            slot.v = ((&slot.v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let update = ((&slot.m / bc1)? / ((&slot.v / bc2)?.sqrt()? + c.eps)?)?;
            let theta = slot.var.as_tensor();
            let decay = if theta.rank() >= 2 { 1.0 - lr * c.weight_decay } else { 1.0 };
            slot.var.set(&((theta * decay)? - (update * lr)?)?)?;
        }
        Ok(())
    }

    /// The moments as named tensors (`m.<name>`, `v.<name>`).
    pub fn state(&self) -> HashMap<String, Tensor> {
        self.slots
            .iter()
            .flat_map(|(n, s)| [(format!("m.{n}"), s.m.clone()), (format!("v.{n}"), s.v.clone())])
            .collect()
    }

    /// Restores the moments saved by [`AdamW::state`] after `step` updates; every variable must
    /// have both moments, of its shape.
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>, step: u64) -> Result<()> {
        for (name, slot) in self.slots.iter_mut() {
            let get = |key: String| -> Result<Tensor> {
                let t = state
                    .get(&key)
                    .ok_or_else(|| TrainError::Checkpoint(format!("optimizer state: `{key}` is missing")))?;
                if t.dims() != slot.var.dims() {
                    return Err(TrainError::Checkpoint(format!(
                        "optimizer state: `{key}` has shape {:?}, expected {:?}",
                        t.dims(),
                        slot.var.dims()
                    )));
                }
                Ok(t.clone())
            };
            slot.m = get(format!("m.{name}"))?;
            slot.v = get(format!("v.{name}"))?;
        }
        if state.len() != 2 * self.slots.len() {
            return Err(TrainError::Checkpoint(format!(
                "optimizer state: {} tensors, expected {}",
                state.len(),
                2 * self.slots.len()
            )));
        }
        self.step = step;
        Ok(())
    }
}

/// Scales the gradients of `vars` so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping. `grads` is updated in place.
pub fn clip_grad_norm(vars: &[Var], grads: &mut GradStore, max_norm: f64) -> Result<f64> {
    let mut total = 0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            total += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
    }
    let norm = total.sqrt();
    if norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * scale)?);
            }
        }
    }
    Ok(norm)
}
