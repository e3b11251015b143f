//! Fuzzes the `.npy` reader on arbitrary bytes: it must return `Ok` or `Err`, never panic, and
//! whatever it accepts must be self-consistent (element count equal to the shape's product).

#![no_main]

use attn_cli::io::{checked_numel, parse_npy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = parse_npy("fuzz.npy", data) {
        assert_eq!(checked_numel(&t.shape).ok(), Some(t.numel()));
    }
});
