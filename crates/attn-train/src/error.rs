//! The training crate's error type: data problems ([`DataError`]), checkpoints that are missing,
//! truncated or from another configuration, bad settings, and wrapped module, attention and candle
//! failures.

use std::path::PathBuf;

use thiserror::Error;

use crate::data::DataError;

/// Why training, evaluation or translation was refused or failed.
#[derive(Debug, Error)]
pub enum TrainError {
    /// Reading or preparing the data failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A setting is unusable.
    #[error("{field}: {reason}")]
    Setting {
        /// The setting (as its command-line flag).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint is missing, truncated, inconsistent or from another configuration.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The model refused a call.
    #[error(transparent)]
    Nn(#[from] attn_nn::NnError),
    /// An attention call (or a mask built for one) was refused.
    #[error(transparent)]
    Attn(#[from] attn::AttnLibError),
    /// A candle operation failed.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// Drawing a curve failed.
    #[error(transparent)]
    Chart(#[from] attn::chart::ChartError),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;
