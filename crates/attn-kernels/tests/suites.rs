//! Every suite of attn-kernels's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.

#[path = "bf16_compute.rs"]
mod bf16_compute;
mod common;
#[path = "delta_chunks.rs"]
mod delta_chunks;
mod delta_common;
#[path = "delta_rule.rs"]
mod delta_rule;
#[path = "differential.rs"]
mod differential;
#[path = "golden.rs"]
mod golden;
#[path = "golden_bf16.rs"]
mod golden_bf16;
#[path = "golden_gradients.rs"]
mod golden_gradients;
/// The golden suites' helpers in `tests/golden_parts/`.
mod golden_parts {
    pub mod compare;
    pub mod fixture;
}
#[path = "gradients.rs"]
mod gradients;
mod gradients_parts;
#[path = "linear.rs"]
mod linear;
mod linear_common;
#[path = "linear_edges.rs"]
mod linear_edges;
#[path = "linear_into.rs"]
mod linear_into;
#[path = "linear_segments.rs"]
mod linear_segments;
#[path = "merge.rs"]
mod merge;
#[path = "paged.rs"]
mod paged;
#[path = "paged_cascade.rs"]
mod paged_cascade;
#[path = "properties.rs"]
mod properties;
#[path = "score_mod.rs"]
mod score_mod;
#[path = "semantics.rs"]
mod semantics;
mod semantics_parts;
#[path = "side_grads.rs"]
mod side_grads;
#[path = "sinks.rs"]
mod sinks;
#[path = "sparse.rs"]
mod sparse;
#[path = "sparse_patterns.rs"]
mod sparse_patterns;
#[path = "varlen.rs"]
mod varlen;
mod varlen_parts;
