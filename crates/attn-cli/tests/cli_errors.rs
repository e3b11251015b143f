//! Usage errors of the `attn` command: a bad flag value, an unknown subcommand or flag, and a
//! missing argument each give exit code 1 and one `error:` line pointing at the right `--help`;
//! `--help` and `--version` print clap's text and exit 0.

use std::process::{Command, Output};

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().unwrap()
}

/// Checks `attn ARGS` fails with exit code 1, nothing on stdout and one `error:` line on stderr
/// that contains every string of `wanted`.
fn usage_error(args: &[&str], wanted: &[&str]) {
    let out = attn(args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}: stderr {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(stderr.lines().count(), 1, "{args:?}: stderr {stderr}");
    assert!(stderr.starts_with("error: ") && !stderr.starts_with("error: error:"), "{args:?}: stderr {stderr}");
    assert!(!stderr.contains('\x1b'), "{args:?}: colour codes in {stderr:?}");
    for w in wanted {
        assert!(stderr.contains(w), "{args:?}: {w:?} not in {stderr}");
    }
}

#[test]
fn bad_flag_value_is_one_line() {
    usage_error(
        &["run", "in.safetensors", "-o", "out.safetensors", "--window", "x"],
        &["invalid value 'x' for '--window", "LEFT,RIGHT", "(see 'attn run --help')"],
    );
    usage_error(
        &["heatmap", "w.safetensors", "-o", "h.png", "--batch", "two"],
        &["invalid value 'two' for '--batch", "(see 'attn heatmap --help')"],
    );
}

#[test]
fn unknown_subcommand_and_flag_are_one_line() {
    usage_error(&["frobnicate"], &["unrecognized subcommand 'frobnicate'", "(see 'attn --help')"]);
    usage_error(&["bench", "--bogus"], &["'--bogus'", "(see 'attn bench --help')"]);
}

#[test]
fn missing_required_arguments_are_named_on_one_line() {
    usage_error(&["run", "in.safetensors"], &["required", "--output", "(see 'attn run --help')"]);
    usage_error(&["heatmap", "-o", "h.png"], &["required", "<INPUT>", "(see 'attn heatmap --help')"]);
}

#[test]
fn conflicting_flags_are_one_line() {
    usage_error(&["heatmap", "w.safetensors", "-o", "h.png", "--head", "1", "--all-heads"], &["--all-heads"]);
}

#[test]
fn help_and_version_exit_zero_on_stdout() {
    for args in [&["--help"][..], &["heatmap", "--help"], &["help", "run"]] {
        let out = attn(args);
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: stderr {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("Usage: attn"), "{args:?}: stdout {stdout}");
    }
    let out = attn(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), format!("attn {}", env!("CARGO_PKG_VERSION")));
}
