//! How a translator is trained: the task, the optimiser's and schedule's numbers, the intervals of
//! evaluation and checkpoints. Saved in each checkpoint so `--resume` continues with the same ones.

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

/// The training settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    /// The data.
    pub task: TaskSpec,
    /// Total optimiser steps.
    pub steps: u64,
    /// Sequences per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: u64,
    /// Global gradient-norm limit.
    pub clip: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Seed of the data order, initialisation and dropout.
    pub seed: u64,
    /// Held-out pairs evaluated (exact match).
    pub held_out: usize,
    /// Steps between evaluations.
    pub eval_every: u64,
    /// Steps between checkpoints.
    pub checkpoint_every: u64,
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
            held_out: 1000,
            eval_every: 250,
            checkpoint_every: 500,
        }
    }
}

impl TrainSettings {
    /// Refuses unusable settings, naming the flag.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::Setting { field, reason });
        if self.steps == 0 || self.batch == 0 {
            return bad("--steps", format!("--steps {} and --batch {} must be positive", self.steps, self.batch));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("--lr", format!("{} must be a positive number", self.lr));
        }
        if !(self.clip.is_finite() && self.clip > 0.0 && self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(
                "--clip",
                format!("clip {} must be positive and weight decay {} non-negative", self.clip, self.weight_decay),
            );
        }
        if self.held_out == 0 || self.eval_every == 0 || self.checkpoint_every == 0 {
            return bad(
                "--eval-every",
                "held-out size and the evaluation and checkpoint intervals must be positive".into(),
            );
        }
        Ok(())
    }
}
