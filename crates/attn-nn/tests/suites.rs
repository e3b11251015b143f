//! Every suite of attn-nn's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.
//! `one_line_errors.rs` stays a binary of its own: it sets a process-wide environment variable.

mod common;
#[path = "decoding.rs"]
mod decoding;
#[path = "errors.rs"]
mod errors;
#[path = "fused.rs"]
mod fused;
#[path = "gated_delta_net.rs"]
mod gated_delta_net;
#[path = "gradient_flow.rs"]
mod gradient_flow;
#[path = "linear_attention.rs"]
mod linear_attention;
#[path = "loading.rs"]
mod loading;
#[path = "packed.rs"]
mod packed;
#[path = "pytorch_parity.rs"]
mod pytorch_parity;
/// The parity suites' helpers in `tests/pytorch_parity_parts/`.
mod pytorch_parity_parts {
    pub mod check;
    pub mod fixture;
    pub mod models;
}
#[path = "semantics.rs"]
mod semantics;
