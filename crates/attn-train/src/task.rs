//! The data of a training run: which pairs batch `k` holds (a pure function of the seed and `k`,
//! so a resumed run continues exactly), the held-out pairs, and the vocabulary.

use crate::data::{read_pairs, split_held_out, BatchOrder, DatesTask, Pair, Vocab};
use crate::error::Result;
use crate::settings::{TaskSpec, TrainSettings};

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
    },
}

impl Task {
    /// Opens the task of `settings`; a pairs file is read with lines longer than `max_len`
    /// positions refused.
    pub fn open(settings: &TrainSettings, max_len: usize) -> Result<Self> {
        Ok(match &settings.task {
            TaskSpec::Dates => Task::Dates(DatesTask::with_held_out(settings.seed, settings.held_out)?),
            TaskSpec::Pairs(path) => {
                let pairs = read_pairs(path, max_len)?;
                let (train, held_out) = split_held_out(pairs, settings.held_out, settings.seed)?;
                let order = BatchOrder::new(train.len(), settings.batch, settings.seed)?;
                Task::Pairs { train, held_out, order }
            }
        })
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
