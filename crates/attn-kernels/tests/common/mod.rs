//! Shared helpers of the attention test suites, one job per file:
//! - `generator`: a seeded generator and random masks and biases;
//! - `dense`: owned broadcast mask/bias tensors and every broadcast shape;
//! - `blocks`: a block's class counted from its elements;
//! - `case`: an owned test [`Case`] (inputs plus every option);
//! - `run`: a case run through a kernel and through `reference::<f64>` / `reference::<f32>`, and
//!   the oracle assertion;
//! - `math_path`: a second `f32` baseline written as PyTorch's math path computes attention;
//! - `mask_rules`: an independent statement of the mask rules (written from the documented
//!   semantics, not from `mask.rs`);
//! - `kernels`: the `kernel_tests!` macro that turns one check into one `#[test]` per kernel, and
//!   `isa_test!`, which marks the tests of an instruction set this machine lacks ignored.

// Each test binary uses its own subset of these helpers and of their re-exports.
#![allow(dead_code, unused_imports, unused_macros)]

mod blocks;
mod case;
mod dense;
mod generator;
mod kernels;
mod mask_rules;
mod math_path;
mod run;

pub use blocks::block_truth;
pub use case::{dims, Case, Scored, Sparse};
pub use dense::{broadcast_shape, Dense, SHAPE_CODES};
pub use generator::{random_bias, random_keep, Rng};
pub use kernels::{assert_available, for_kernel};
pub(crate) use kernels::{isa_test, kernel_tests};
pub use math_path::{math_path, math_path_rounded, MathPath};
pub use run::{assert_bit_identical, assert_oracle, oracle_verdict, Oracle};
