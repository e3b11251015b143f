//! The crate's error: every failure names the file (or model) and the field it concerns, in one
//! line, so `attn` can print it and exit non-zero.

use std::path::{Path, PathBuf};

/// Why a model could not be fetched, loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file is missing, unreadable or not what its name says (wrong magic, truncated).
    #[error("{}: {reason}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A field of a file (a `config.json` key, a GGUF metadata key or tensor) is missing or has
    /// an unusable value.
    #[error("{}: `{field}`: {reason}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field: a JSON key, a GGUF metadata key or a tensor name.
        field: String,
        /// Expected against found, in words.
        reason: String,
    },
    /// An input the model cannot take (a prompt longer than its context, an empty batch).
    #[error("{0}")]
    Input(String),
    /// Downloading or unpacking a model's packages failed.
    #[error("fetching {model}: {reason}")]
    Fetch {
        /// The model's name (`minilm`, ...).
        model: String,
        /// What went wrong.
        reason: String,
    },
    /// A module refused its weights or inputs.
    #[error(transparent)]
    Nn(#[from] attn_nn::NnError),
    /// An attention call failed.
    #[error(transparent)]
    Attn(#[from] attn::AttnLibError),
    /// A tensor operation failed.
    #[error("{}", attn::error::one_line(.0))]
    Candle(#[from] candle_core::Error),
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    /// A [`ModelError::File`] for `path`.
    pub fn file(path: &Path, reason: impl std::fmt::Display) -> Self {
        Self::File { path: path.to_path_buf(), reason: reason.to_string() }
    }

    /// A [`ModelError::Field`] for `field` of `path`.
    pub fn field(path: &Path, field: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::Field { path: path.to_path_buf(), field: field.into(), reason: reason.to_string() }
    }
}
