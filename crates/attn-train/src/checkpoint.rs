//! Checkpoints: a folder holding `config.json` (format, step, the model's sizes, the training
//! settings and the history of loss and accuracy), `vocab.json`, `model.safetensors` (the weights
//! by their PyTorch-style names) and `optimizer.safetensors` (AdamW's moments).
//!
//! Each file is written whole or not at all (a temporary file renamed into place, as every file
//! `attn` writes), `config.json` last; both
//! tensor files also record the step, so a folder whose files come from different saves is
//! refused rather than silently mixed, and `model.safetensors` records what defines the run
//! ([`crate::fingerprint`]), so an edited `config.json` or another `vocab.json` is refused naming
//! what differs. Loading checks the format, the step, the record, every weight's name and shape,
//! and reports a missing, truncated or foreign file by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::data::Vocab;
use crate::error::{one_line, Result, TrainError};
use crate::fingerprint;
use crate::model::ModelConfig;
use crate::settings::TrainSettings;

/// The format tag of `config.json`.
pub const FORMAT: &str = "attn-translator/2";
/// The tensor that records the step inside the tensor files.
const STEP_KEY: &str = "checkpoint.step";

/// One evaluation of the held-out set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Steps done when it was made.
    pub step: u64,
    /// Exact-match accuracy in `[0, 1]`.
    pub accuracy: f64,
}

/// Loss and accuracy so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// `(steps done, mean training loss over the last interval)`.
    pub loss: Vec<(u64, f64)>,
    /// Held-out evaluations.
    pub evaluations: Vec<Evaluation>,
}

/// The contents of `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// Steps done.
    pub step: u64,
    /// The model's sizes.
    pub model: ModelConfig,
    /// How it is trained.
    pub train: TrainSettings,
    /// What it trains on: `dates` (the built-in task) or the SHA-256 of the pairs file's contents
    /// ([`fingerprint::sha256`]).
    pub data: String,
    /// Loss and accuracy so far.
    pub history: History,
}

/// A loaded checkpoint.
pub struct Checkpoint {
    /// `config.json`.
    pub manifest: Manifest,
    /// `vocab.json`.
    pub vocab: Vocab,
    /// The weights by name.
    pub weights: HashMap<String, Tensor>,
}

fn file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}

/// Writes `bytes` to `path` whole or not at all ([`attn::write_file::write_atomically`]: a
/// temporary file in the same folder, flushed to disk, then renamed; new files get the umask's
/// mode, existing ones keep theirs).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    attn::write_file::write_atomically(path, |w| w.write_all(bytes))
        .map_err(|e| TrainError::Io { path: e.path, source: e.source })
}

/// Saves a checkpoint into `dir` (which must exist); `model.safetensors` gets the run's record.
pub fn save(
    dir: &Path,
    manifest: &Manifest,
    vocab: &Vocab,
    weights: HashMap<String, Tensor>,
    optimizer: HashMap<String, Tensor>,
) -> Result<()> {
    let step = Tensor::new(&[manifest.step as i64], &Device::Cpu)?;
    let record = fingerprint::to_metadata(&fingerprint::record(manifest, vocab));
    for (name, mut tensors, metadata) in
        [("model.safetensors", weights, Some(record)), ("optimizer.safetensors", optimizer, None)]
    {
        tensors.insert(STEP_KEY.into(), step.clone());
        let path = file(dir, name);
        let bytes = safetensors::serialize(&tensors, metadata)
            .map_err(|e| TrainError::Checkpoint(format!("{}: cannot serialise: {e}", path.display())))?;
        write_atomic(&path, &bytes)?;
    }
    write_atomic(&file(dir, "vocab.json"), vocab.to_json().as_bytes())?;
    let json = serde_json::to_string_pretty(manifest)
        .map_err(|e| TrainError::Checkpoint(format!("cannot serialise the manifest: {e}")))?;
    write_atomic(&file(dir, "config.json"), json.as_bytes())
}

/// Reads `config.json` of the checkpoint in `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = file(dir, "config.json");
    if !dir.is_dir() {
        return Err(TrainError::Checkpoint(format!("{}: no such folder", dir.display())));
    }
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let not_manifest =
        |e: serde_json::Error| TrainError::Checkpoint(format!("{}: not a checkpoint manifest: {e}", path.display()));
    let value: serde_json::Value = serde_json::from_str(&text).map_err(not_manifest)?;
    match value.get("format").and_then(serde_json::Value::as_str) {
        Some(FORMAT) => {}
        Some(other) => {
            return Err(TrainError::Checkpoint(format!(
                "{}: format `{other}`, expected `{FORMAT}` (a checkpoint of another attn version: train again)",
                path.display()
            )))
        }
        None => return Err(not_manifest(serde::de::Error::missing_field("format"))),
    }
    let manifest: Manifest = serde_json::from_value(value).map_err(not_manifest)?;
    manifest.model.check()?;
    Ok(manifest)
}

/// Reads a tensor file of the checkpoint, checking its recorded step against `step`; returns its
/// tensors and its metadata.
fn read_tensors(dir: &Path, name: &str, step: u64) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let path = file(dir, name);
    if !path.is_file() {
        return Err(TrainError::Checkpoint(format!("{}: missing", path.display())));
    }
    let unreadable = |e: &dyn std::fmt::Display| {
        TrainError::Checkpoint(format!(
            "{}: unreadable (truncated or not safetensors): {}",
            path.display(),
            one_line(&e.to_string())
        ))
    };
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| unreadable(&e))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let mut tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| unreadable(&e))?;
    let recorded = tensors
        .remove(STEP_KEY)
        .ok_or_else(|| TrainError::Checkpoint(format!("{}: no `{STEP_KEY}` entry", path.display())))?;
    let recorded = recorded.to_dtype(DType::I64)?.to_vec1::<i64>()?;
    if recorded != [step as i64] {
        let saved = recorded.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        return Err(TrainError::Checkpoint(format!(
            "{}: saved at step {saved}, but config.json is at step {step}: files from different saves",
            path.display()
        )));
    }
    Ok((tensors, metadata))
}

/// Loads the checkpoint in `dir` (manifest, vocabulary, weights; not the optimiser state),
/// refusing a `config.json` or `vocab.json` that differs from the record saved with the weights.
pub fn load(dir: &Path) -> Result<Checkpoint> {
    let manifest = read_manifest(dir)?;
    let vocab = Vocab::load(&file(dir, "vocab.json"))?;
    let (weights, metadata) = read_tensors(dir, "model.safetensors", manifest.step)?;
    let differences = fingerprint::differences(&metadata, &fingerprint::record(&manifest, &vocab));
    if !differences.is_empty() {
        return Err(TrainError::Checkpoint(format!(
            "{}: changed since model.safetensors was saved: {}",
            dir.display(),
            differences.join("; ")
        )));
    }
    if vocab.len() != manifest.model.vocab {
        return Err(TrainError::Checkpoint(format!(
            "vocab.json has {} tokens, config.json says {}",
            vocab.len(),
            manifest.model.vocab
        )));
    }
    Ok(Checkpoint { manifest, vocab, weights })
}

/// Loads the optimiser state of the checkpoint in `dir` at `step`.
pub fn load_optimizer(dir: &Path, step: u64) -> Result<HashMap<String, Tensor>> {
    Ok(read_tensors(dir, "optimizer.safetensors", step)?.0)
}
