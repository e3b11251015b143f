//! What the fixture loaders of the suites share (the kernels' golden fixtures of
//! `scripts/gen_fixtures.py`, the modules' of `scripts/gen_module_fixtures.py`): listing a
//! fixture directory, reading a safetensors file's metadata, and decoding stored little-endian
//! elements. Errors are strings naming the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

/// Every `*.safetensors` file of `dir`, sorted by name; panics naming `dir` when it cannot be
/// read (a test's fixtures are part of the repository).
pub fn safetensors_in(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", dir.display())).path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    paths
}

/// The parsed file `bytes` (named `file` in errors) and its string metadata (empty when the
/// header has none).
pub fn parse<'a>(file: &str, bytes: &'a [u8]) -> Result<(SafeTensors<'a>, HashMap<String, String>), String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("{file}: not a safetensors file: {e}"))?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| format!("{file}: {e}"))?;
    Ok((st, header.metadata().clone().unwrap_or_default()))
}

/// Little-endian `f64` elements.
pub fn le_f64(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("chunk of 8"))).collect()
}

/// Little-endian `i64` elements.
pub fn le_i64(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("chunk of 8"))).collect()
}

/// Boolean (or `u8`) elements: non-zero is `true`.
pub fn flags(bytes: &[u8]) -> Vec<bool> {
    bytes.iter().map(|&b| b != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders_read_little_endian_elements() {
        let bytes: Vec<u8> = [1.5f64, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(le_f64(&bytes), [1.5, -2.0]);
        let bytes: Vec<u8> = [7i64, -3].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(le_i64(&bytes), [7, -3]);
        assert_eq!(flags(&[0, 1, 2]), [false, true, true]);
    }

    #[test]
    fn a_file_that_is_not_safetensors_is_an_error_naming_it() {
        let e = parse("x.safetensors", b"not a file").unwrap_err();
        assert!(e.starts_with("x.safetensors: not a safetensors file"), "{e}");
    }
}
