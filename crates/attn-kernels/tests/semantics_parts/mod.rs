//! The check groups of `semantics.rs` that are not about masks: input values and layouts
//! (`inputs`), dropout (`dropout`) and empty sizes and parameter errors (`limits`).

pub mod dropout;
pub mod inputs;
pub mod limits;
