//! Every suite of attn-models's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.

#[path = "errors.rs"]
mod errors;
#[path = "real_models.rs"]
mod real_models;
