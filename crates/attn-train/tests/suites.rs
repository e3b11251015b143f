//! Every suite of attn-train's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.

#[path = "batch.rs"]
mod batch;
#[path = "dates.rs"]
mod dates;
#[path = "experiments.rs"]
mod experiments;
#[path = "pairs.rs"]
mod pairs;
#[path = "training.rs"]
mod training;
#[path = "vocab.rs"]
mod vocab;
