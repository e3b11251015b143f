//! Helpers of the packed-sequence suite.
#![allow(dead_code)]
pub mod case;
