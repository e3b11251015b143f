//! How a layer call runs ([`Run`]): evaluation or training (dropout's [`Mode`]) and whether the
//! attention weights come back ([`NeedWeights`]).

use crate::dropout::Mode;
use crate::mha::NeedWeights;

/// How a layer call runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Run {
    /// Evaluation or training (dropout on).
    pub mode: Mode,
    /// Return the attention weights (computed only then).
    pub need_weights: Option<NeedWeights>,
}

impl Run {
    /// Evaluation, no weights.
    pub fn eval() -> Self {
        Self::default()
    }

    /// Training with a fresh dropout seed per call, no weights.
    pub fn train() -> Self {
        Self { mode: Mode::Train, need_weights: None }
    }

    /// Training step `step` (dropout masks a function of the module and the step), no weights.
    pub fn train_step(step: u64) -> Self {
        Self { mode: Mode::TrainStep(step), need_weights: None }
    }

    /// Also return the weights.
    pub fn with_weights(self, which: NeedWeights) -> Self {
        Self { need_weights: Some(which), ..self }
    }
}
