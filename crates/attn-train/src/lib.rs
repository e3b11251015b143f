//! Training and using the `attn` translator, a sequence-to-sequence Transformer
//! ([`attn_nn::Seq2Seq`]) over characters:
//!
//! - [`data`]: the built-in dates-to-ISO task, the character vocabulary, a user's tab-separated
//!   parallel text, and padded batches in a seeded order;
//! - [`trainer`]: the training loop (AdamW from [`optim`], the [`schedule`], the [`loss`]),
//!   held-out evaluation, checkpoints ([`checkpoint`], with the record of the run from
//!   [`fingerprint`]) and curves; exactly resumable;
//! - [`translate`]: greedy translation from a checkpoint and its cross-attention;
//! - [`experiments`]: the computations of `attn explain` (scaling of dot products, what a trained
//!   model's heads attend to, a self-attention classifier);
//! - [`model`], [`settings`], [`task`]: what a run is made of.

pub mod checkpoint;
pub mod data;
pub mod error;
pub mod experiments;
pub mod fingerprint;
pub mod loss;
pub mod model;
pub mod optim;
pub mod schedule;
pub mod settings;
pub mod task;
pub mod trainer;
pub mod translate;

pub use error::{Result, TrainError};
