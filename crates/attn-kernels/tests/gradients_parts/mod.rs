#![allow(dead_code)]
pub mod consistency;
pub mod finite_diff;
pub mod harness;
