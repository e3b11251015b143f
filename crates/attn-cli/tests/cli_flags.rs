//! Flags of `attn run` and `attn bench` that a first trial tripped over: negative numbers get the
//! allowed range (not clap's "unexpected argument"), the kernel `auto` resolved to is reported,
//! dropout's default seed is stated, and `--threads` is bounded and shared by both commands.

use crate::common;

use attn_kernels::Kernel;
use common::*;
use serde_json::Value;

fn attn_cmd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().unwrap()
}

fn ok_stdout(o: &Output) -> String {
    assert!(o.status.success(), "stderr {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The one stderr line of a command that fails with exit code 1.
fn error_line(o: &Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stderr
}

/// `auto` as reported: `auto (flash-avx512)` on a CPU with AVX-512F, and so on.
fn auto_text() -> String {
    format!("auto ({})", Kernel::Auto.resolve().unwrap().name())
}

fn small_input(dir: &Path) -> PathBuf {
    let t = f32_tensor(&[1, 2, 5, 4], 3);
    let input = dir.join("in.safetensors");
    write(&input, &[("q", &t), ("k", &t), ("v", &t)]);
    input
}

#[test]
fn negative_values_are_told_their_range() {
    let run = ["run", "in.safetensors", "-o", "out.safetensors"];
    for (flag, value, want) in [
        ("--softcap", "-1", "'--softcap <C>': -1 is outside (0, inf)"),
        ("--dropout", "-0.1", "'--dropout <P>': -0.1 is outside [0, 1)"),
        ("--dropout", "1", "'--dropout <P>': 1 is outside [0, 1)"),
        ("--threads", "-2", "'--threads <N>': -2 is outside [1, 1024]"),
    ] {
        let e = error_line(&attn_cmd(&[&run[..], &[flag, value]].concat()));
        assert!(e.contains(want), "{flag} {value}: {e}");
    }
    for (flag, value, want) in [
        ("--budget", "-1", "'--budget <SECONDS>': -1 is outside [0, inf]"),
        ("--softcap", "-2.5", "'--softcap <C>': -2.5 is outside (0, inf)"),
        ("--threads", "5000", "'--threads <N>': 5000 is outside [1, 1024]"),
        ("--threads", "0", "'--threads <N>': 0 is outside [1, 1024]"),
        ("--seed", "-1", "'--seed <SEED>'"),
    ] {
        let e = error_line(&attn_cmd(&["bench", "--shape", "1,1,4,4", "--dropout", "0.1", flag, value]));
        assert!(e.contains(want), "{flag} {value}: {e}");
    }
}

#[test]
fn run_reports_the_kernel_auto_resolved_to_and_the_dropout_seed() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let out = out_path(dir.path());
    let o = attn_cmd(&["run", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--dropout", "0.1"]);
    let stdout = ok_stdout(&o);
    assert!(stdout.contains(&format!("-> {} kernel", auto_text())), "{stdout}");
    assert!(stdout.contains("dropout 0.1, seed 0 (default)"), "{stdout}");
    let o = attn_cmd(&["run", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--dropout", "0.1", "--seed", "7"]);
    let stdout = ok_stdout(&o);
    assert!(stdout.contains("dropout 0.1, seed 7") && !stdout.contains("(default)"), "{stdout}");
    let o = attn_cmd(&["run", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--kernel", "reference"]);
    let stdout = ok_stdout(&o);
    assert!(stdout.contains("-> reference kernel") && !stdout.contains("dropout"), "{stdout}");
}

#[test]
fn bench_reports_the_kernel_auto_resolved_to_and_the_dropout_seed() {
    let json = ok_stdout(&attn_cmd(&["bench", "--shape", "1,1,8,4", "--iters", "1", "--json", "--dropout", "0.2"]));
    let row: Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(row["kernel"], "auto");
    assert_eq!(row["kernel_resolved"], Kernel::Auto.resolve().unwrap().name());
    assert_eq!((row["dropout"].as_f64().map(|p| p as f32), row["seed"].as_u64()), (Some(0.2), Some(0)));
    let table = ok_stdout(&attn_cmd(&["bench", "--shape", "1,1,8,4", "--iters", "1", "--dropout", "0.2"]));
    assert!(table.contains(&auto_text()), "{table}");
    assert!(table.contains("dropout 0.2, seed 0 (default)"), "{table}");
}

#[test]
fn help_states_the_default_dropout_seed_and_the_thread_bound() {
    for cmd in ["run", "bench"] {
        let help = ok_stdout(&attn_cmd(&[cmd, "--help"]));
        assert!(help.contains("without --seed the seed is 0"), "{cmd}: {help}");
        assert!(help.contains("at most 1024"), "{cmd}: {help}");
    }
}

#[test]
fn run_takes_a_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let out = out_path(dir.path());
    let one = dir.path().join("one.safetensors");
    ok_stdout(&attn_cmd(&["run", input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--threads", "3"]));
    ok_stdout(&attn_cmd(&["run", input.to_str().unwrap(), "-o", one.to_str().unwrap(), "--threads", "1"]));
    assert_eq!(read_safetensors(&out).unwrap(), read_safetensors(&one).unwrap());
}
