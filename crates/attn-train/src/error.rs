//! The training crate's error type: data problems ([`DataError`]), checkpoints that are missing,
//! truncated or from another configuration, bad settings (named as `config.json` names them, so a
//! command line can add its own flag), output folders that are not the trainer's, texts the model
//! cannot take, and wrapped module, attention and candle failures. Each displays as one line.

use std::path::PathBuf;

use thiserror::Error;

use crate::data::DataError;
use crate::translate::Unanswered;

/// Why training, evaluation or translation was refused or failed.
#[derive(Debug, Error)]
pub enum TrainError {
    /// Reading or preparing the data failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A setting is unusable.
    #[error("{field}: {reason}")]
    Setting {
        /// The setting, by its field name (`heads`, `held_out`, `train_size`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint is missing, truncated, inconsistent or from another configuration.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A fresh run's folder already holds a checkpoint.
    #[error("{} already holds a checkpoint of a run: resume it, or choose another folder", .path.display())]
    HoldsCheckpoint {
        /// The folder.
        path: PathBuf,
    },
    /// A fresh run's folder holds files the trainer did not write.
    #[error(
        "{} holds files the trainer did not write ({}): choose a new or empty folder",
        .path.display(), .files.join(", ")
    )]
    ForeignFiles {
        /// The folder.
        path: PathBuf,
        /// The files, each with why it is not the trainer's when that is not plain.
        files: Vec<String>,
    },
    /// A text the model cannot take.
    #[error("{text}: {reason}")]
    Text {
        /// The text, quoted and cut short ([`crate::translate::excerpt`]).
        text: String,
        /// Why.
        reason: Unanswered,
    },
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
    #[error("candle: {}", one_line(&.0.to_string()))]
    Candle(#[from] candle_core::Error),
    /// Drawing a curve failed.
    #[error(transparent)]
    Chart(#[from] attn::chart::ChartError),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// `text` as one line: a backtrace that candle appends to its errors when `RUST_BACKTRACE` is set
/// (from the first line that starts like a frame, `0: …`) is cut off, and the other lines are
/// joined with `: `.
///
/// ```
/// use attn_train::error::one_line;
/// let candle = "shape mismatch, expected: [4], got: [3]\n   0: candle_core::error::Error::bt\n      at src/error.rs:1";
/// assert_eq!(one_line(candle), "shape mismatch, expected: [4], got: [3]");
/// assert_eq!(one_line("while loading\nno such tensor"), "while loading: no such tensor");
/// ```
pub fn one_line(text: &str) -> String {
    let is_frame = |line: &str| {
        let t = line.trim_start();
        let digits = t.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && t[digits..].starts_with(": ")
    };
    let kept: Vec<&str> =
        text.lines().take_while(|l| !is_frame(l) && l.trim() != "stack backtrace:").map(str::trim).collect();
    kept.into_iter().filter(|l| !l.is_empty()).collect::<Vec<_>>().join(": ")
}
