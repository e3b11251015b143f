//! Every suite of attn's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.

#[path = "allocation.rs"]
mod allocation;
#[path = "autograd.rs"]
mod autograd;
#[path = "cache.rs"]
mod cache;
#[cfg(feature = "pictures")]
#[path = "chart.rs"]
mod chart;
mod common;
#[path = "delta.rs"]
mod delta;
#[cfg(feature = "pictures")]
#[path = "heatmap.rs"]
mod heatmap;
#[cfg(feature = "pictures")]
#[path = "heatmap_masks.rs"]
mod heatmap_masks;
#[cfg(feature = "pictures")]
mod heatmap_parts;
#[cfg(feature = "pictures")]
#[path = "heatmap_sparse.rs"]
mod heatmap_sparse;
#[path = "linear.rs"]
mod linear;
#[path = "masks.rs"]
mod masks;
#[path = "precision.rs"]
mod precision;
#[path = "readme.rs"]
mod readme;
#[path = "score_mod.rs"]
mod score_mod;
#[path = "sdpa.rs"]
mod sdpa;
#[path = "side_outputs.rs"]
mod side_outputs;
#[path = "sparse.rs"]
mod sparse;
#[path = "varlen.rs"]
mod varlen;
