//! Fuzzes the `.npz` reader on arbitrary bytes: it must return `Ok` or `Err`, never panic or
//! allocate from an unchecked size, and whatever it accepts must be self-consistent (element
//! count equal to each array's shape product).

#![no_main]

use attn_cli::io::{checked_numel, parse_npz};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = parse_npz("fuzz.npz", data) {
        for t in tensors.values() {
            assert_eq!(checked_numel(&t.shape).ok(), Some(t.numel()));
        }
    }
});
