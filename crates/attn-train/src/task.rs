//! The data of a training run: which pairs batch `k` holds (a pure function of the seed and `k`,
//! so a resumed run continues exactly), the held-out pairs, the vocabulary, and the fingerprint of
//! the data (`dates`, or the SHA-256 of the pairs file's contents) a resumed run compares.

use crate::checkpoint::Manifest;
use crate::data::{dates, parse_pairs, read_pairs_file, split_held_out, BatchOrder, DataError, DatesTask, Pair, Vocab};
use crate::error::{Result, TrainError};
use crate::fingerprint::sha256;
use crate::settings::{default_held_out, TaskSpec, TrainSettings};

/// The fingerprint of the built-in dates task.
pub const DATES: &str = "dates";

/// The pairs a run trains and evaluates on.
pub enum Task {
    /// The built-in dates: an endless stream of training pairs.
    Dates(DatesTask),
    /// A user's pairs: epochs over a fixed set in a seeded order.
    Pairs {
        /// Training pairs.
        train: Vec<Pair>,
        /// Held-out pairs.
        held_out: Vec<Pair>,
        /// The order of the training pairs.
        order: BatchOrder,
        /// Pairs in the file.
        total: usize,
        /// The SHA-256 of the file's contents.
        sha256: String,
    },
}

impl Task {
    /// Opens the task of `settings`; a pairs file is read with lines longer than `max_len`
    /// positions refused. Without a held-out size, [`default_held_out`] of the data is held out.
    pub fn open(settings: &TrainSettings, max_len: usize) -> Result<Self> {
        Ok(match &settings.task {
            TaskSpec::Dates => {
                let dates = (dates::FIRST_DAY.to_days()..=dates::LAST_DAY.to_days()).count();
                let held_out = held_out_of(settings, dates, "the dates task", "dates")?;
                Task::Dates(DatesTask::with_held_out(settings.seed, held_out)?)
            }
            TaskSpec::Pairs(path) => {
                let bytes = read_pairs_file(path)?;
                let pairs = parse_pairs(&bytes, path, max_len)?;
                let total = pairs.len();
                let held_out = held_out_of(settings, total, &path.display().to_string(), "pairs")?;
                let (train, held_out) = split_held_out(pairs, held_out, settings.seed).map_err(|e| match e {
                    DataError::Argument { found, .. } => {
                        TrainError::Setting { field: "held_out", reason: format!("{}: {found}", path.display()) }
                    }
                    e => e.into(),
                })?;
                let order = BatchOrder::new(train.len(), settings.batch, settings.seed)?;
                Task::Pairs { train, held_out, order, total, sha256: sha256(&bytes) }
            }
        })
    }

    /// What the run trains on, as [`crate::checkpoint::Manifest::data`] records it.
    pub fn fingerprint(&self) -> String {
        match self {
            Task::Dates(_) => DATES.into(),
            Task::Pairs { sha256, .. } => sha256.clone(),
        }
    }

    /// Refuses data whose fingerprint is not the one `manifest` recorded when its run started: a
    /// pairs file whose contents changed would train on, or evaluate with, other pairs.
    pub fn check_unchanged(&self, manifest: &Manifest) -> Result<()> {
        let now = self.fingerprint();
        if now == manifest.data {
            return Ok(());
        }
        let data = match &manifest.train.task {
            TaskSpec::Pairs(path) => path.display().to_string(),
            TaskSpec::Dates => "the dates task".into(),
        };
        Err(TrainError::Data(DataError::Changed { data, then: manifest.data.clone(), now }))
    }

    /// `(held out, total)`: how many pairs (dates for the dates task) are held out, of how many.
    pub fn held_out_of_total(&self) -> (usize, usize) {
        match self {
            Task::Dates(d) => (d.held_out_examples().len(), d.held_out_examples().len() + d.num_train_dates()),
            Task::Pairs { held_out, total, .. } => (held_out.len(), *total),
        }
    }

    /// The vocabulary: the dates' fixed one, or the characters of every pair.
    pub fn vocab(&self) -> Vocab {
        match self {
            Task::Dates(_) => DatesTask::vocab(),
            Task::Pairs { train, held_out, .. } => {
                Vocab::from_texts(train.iter().chain(held_out).flat_map(|(s, t)| [s.as_str(), t.as_str()]))
            }
        }
    }

    /// The pairs of training step `step` (0-based), `batch` of them.
    pub fn batch(&self, step: u64, batch: usize) -> Vec<Pair> {
        match self {
            Task::Dates(d) => d.train_pairs(step * batch as u64, batch),
            Task::Pairs { train, order, .. } => order.batch(step).into_iter().map(|i| train[i].clone()).collect(),
        }
    }

    /// The held-out pairs.
    pub fn held_out(&self) -> Vec<Pair> {
        match self {
            Task::Dates(d) => d.held_out(),
            Task::Pairs { held_out, .. } => held_out.clone(),
        }
    }
}

/// The held-out size of `settings` for `items` pairs or dates of `source`, refused unless one is
/// left to train on.
fn held_out_of(settings: &TrainSettings, items: usize, source: &str, unit: &str) -> Result<usize> {
    let held_out = settings.held_out.unwrap_or_else(|| default_held_out(items));
    if held_out >= items {
        let unit = if items == 1 { unit.trim_end_matches('s') } else { unit };
        return Err(TrainError::Setting {
            field: "held_out",
            reason: format!(
                "{source} holds {items} {unit}: holding out {held_out} for evaluation leaves none to train on"
            ),
        });
    }
    Ok(held_out)
}
