//! What the `attn train` and `attn translate` suites share: running the built binary (with
//! arguments, standard input or environment), the flags of a tiny model, and small data files.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `attn ARGS` with `env` added to the environment, `stdin` on standard input.
pub fn attn_with(args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attn starts");
    child.stdin.take().expect("piped").write_all(stdin).expect("stdin is written");
    child.wait_with_output().expect("attn runs")
}

/// `attn ARGS` with nothing on standard input.
pub fn attn(args: &[&str]) -> Output {
    attn_with(args, &[], b"")
}

/// The bytes as text (lossy).
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A model small enough to train in a second, evaluated on 20 held-out pairs.
pub const TINY: [&str; 14] = [
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--ff",
    "32",
    "--held-out",
    "20",
    "--eval-every",
    "10",
    "--checkpoint-every",
    "10",
];

/// `attn train --out DIR` with [`TINY`] and `extra`.
pub fn train(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["train", "--out", dir.to_str().expect("UTF-8 path")];
    args.extend(TINY);
    args.extend(extra);
    attn(&args)
}

/// Writes `n` pairs `WORD<TAB>WORD reversed` over the letters a–e to `path`.
pub fn write_pairs(path: &Path, n: usize) {
    let letters = ['a', 'b', 'c', 'd', 'e'];
    let lines: String = (0..n)
        .map(|i| {
            let word: String = (0..3).map(|k| letters[(i / 5usize.pow(k)) % 5]).collect();
            format!("{word}\t{}\n", word.chars().rev().collect::<String>())
        })
        .collect();
    std::fs::write(path, lines).expect("the pairs file is written");
}

/// Asserts `o` failed with exit code 1 and one `error:` line on stderr containing each of `wanted`.
pub fn one_line_error(o: &Output, wanted: &[&str]) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    for w in wanted {
        assert!(err.contains(w), "{w:?} not in {err}");
    }
}
