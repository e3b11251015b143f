//! Fuzzes the safetensors reader on arbitrary bytes: it must return `Ok` or `Err`, never panic,
//! and whatever it accepts must be self-consistent (element count equal to the shape's product).

#![no_main]

use attn_cli::io::{checked_numel, parse_safetensors};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tensors) = parse_safetensors("fuzz.safetensors", data) {
        for t in tensors.values() {
            assert_eq!(checked_numel(&t.shape).ok(), Some(t.numel()));
        }
    }
});
