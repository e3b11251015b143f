//! Test-only helpers shared by the tests of the attn crates (not published, never a dependency of
//! library code).
//!
//! [`oracle`] holds the acceptance rule for fast kernels (FlashAttention's method): a result
//! passes when `max|fast − ref64| ≤ factor · max|naive32 − ref64| + floor`, with `ref64` the `f64`
//! reference, `naive32` the reference run in `f32`, `factor` 2 for outputs and 3 for gradients,
//! and `floor` 4 ulps of `f32` at the reference's magnitude; non-finite values must agree exactly
//! in kind and position.
//!
//! [`fixtures`] holds what the fixture loaders of the suites share (listing, metadata, decoding stored elements).
//!
//! This crate depends on no kernel crate, so that `attn-kernels` can take it as a dev-dependency
//! without a cycle: the rule works on plain slices, the fixture
//! helpers on safetensors bytes.

pub mod fixtures;
pub mod oracle;
