//! How a translator is trained: the task, the optimiser's and schedule's numbers, the intervals of
//! evaluation and checkpoints. Saved in each checkpoint so a resumed run continues with the same
//! ones. Refusals name the field as `config.json` spells it (`held_out`), not a command-line flag.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Where the training pairs come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskSpec {
    /// The built-in dates-to-ISO task.
    Dates,
    /// A user's `SOURCE<TAB>TARGET` file.
    Pairs(PathBuf),
}

/// The training settings. With the `clap` feature, each field but `task` and `steps` (which a
/// command line gives its own way) is a flag (`--held-out`) whose help is the field's doc and whose
/// default is [`TrainSettings::default`]'s; `held_out: None` asks for [`default_held_out`] of the
/// data, which the run records when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TrainSettings {
    /// The data.
    #[cfg_attr(feature = "clap", arg(skip = TrainSettings::default().task))]
    pub task: TaskSpec,
    /// Total optimiser steps.
    #[cfg_attr(feature = "clap", arg(skip = TrainSettings::default().steps))]
    pub steps: u64,
    /// Sequences per step.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().batch))]
    pub batch: usize,
    /// Peak learning rate (after warm-up).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().lr))]
    pub lr: f64,
    /// Warm-up steps.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().warmup))]
    pub warmup: u64,
    /// Global gradient-norm limit.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().clip))]
    pub clip: f64,
    /// AdamW weight decay (decoupled).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().weight_decay))]
    pub weight_decay: f64,
    /// Seed of initialisation, data order and dropout.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().seed))]
    pub seed: u64,
    /// Held-out pairs (dates for the dates task) for exact-match evaluation, never trained on
    /// (default: 5% of the data, at least 1, at most 1000).
    #[cfg_attr(feature = "clap", arg(long))]
    pub held_out: Option<usize>,
    /// Steps between evaluations.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().eval_every))]
    pub eval_every: u64,
    /// Steps between checkpoints.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = TrainSettings::default().checkpoint_every))]
    pub checkpoint_every: u64,
    /// Train on packed batches (the sequences one after another, no padding computed) instead of
    /// padded ones; the same loss (mean over the real target tokens).
    #[cfg_attr(feature = "clap", arg(long))]
    #[serde(default)]
    pub packed: bool,
}

impl Default for TrainSettings {
    /// `attn train`'s defaults: the dates task, 2500 steps of 64 sequences.
    fn default() -> Self {
        Self {
            task: TaskSpec::Dates,
            steps: 2500,
            batch: 64,
            lr: 2e-3,
            warmup: 200,
            clip: 1.0,
            weight_decay: 0.01,
            seed: 0,
            held_out: None,
            eval_every: 250,
            checkpoint_every: 500,
            packed: false,
        }
    }
}

/// The held-out size when none is given: 5% of the `items` (pairs or dates), at least 1 and at
/// most 1,000.
pub fn default_held_out(items: usize) -> usize {
    (items / 20).clamp(1, 1000)
}

impl TrainSettings {
    /// Refuses unusable settings, naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::Setting { field, reason });
        for (field, value) in [
            ("steps", self.steps),
            ("batch", self.batch as u64),
            ("held_out", self.held_out.map_or(1, |n| n as u64)),
            ("eval_every", self.eval_every),
            ("checkpoint_every", self.checkpoint_every),
        ] {
            if value == 0 {
                return bad(field, "must be positive".into());
            }
        }
        for (field, value, least) in [("lr", self.lr, "positive"), ("clip", self.clip, "positive")] {
            if !(value.is_finite() && value > 0.0) {
                return bad(field, format!("{value} must be a {least} number"));
            }
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", format!("{} must be a non-negative number", self.weight_decay));
        }
        Ok(())
    }
}
