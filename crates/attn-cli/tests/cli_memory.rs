//! Requests for more memory than can be had end `attn run` and `attn bench` with exit code 1 and
//! one line saying which buffer of which shape needed how many bytes, and nothing written — never
//! an aborted process. The first tests use shapes whose buffers exceed any address space (the
//! outcome is the same on every machine); the last ones reproduce the reports of issue 11 under a
//! 4 GB address-space limit (`ulimit -v`, through `sh`).

use crate::common;

use common::*;

/// Runs `attn ARGS` with at most 4 GB of address space.
fn attn_limited(args: &[&str]) -> Output {
    attn_in_shell("ulimit -v 4000000", args)
}

/// The single `error:` line of a command that must fail with exit code 1.
fn one_line_error(o: &Output) -> String {
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "exit status {:?}, stderr {stderr}", o.status);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(o.stdout.is_empty(), "stdout {}", String::from_utf8_lossy(&o.stdout));
    stderr
}

#[test]
fn run_weights_beyond_the_address_space_are_refused() {
    // D = 0 keeps the files empty of data while the weights are [1, 1, 1, 2^61] f32: 2^63 bytes.
    let dir = tempfile::tempdir().unwrap();
    let lk = 1usize << 61;
    let q = tensor(&[1, 1, 1, 0], HostData::F32(vec![]));
    let kv = tensor(&[1, 1, lk, 0], HostData::F32(vec![]));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &kv), ("v", &kv)]);
    let out = out_path(dir.path());
    let e = run_err(&["--weights", "-o", out.to_str().unwrap()], &[&input]);
    let want = format!("attention weights [1, 1, 1, {lk}] f32 need 9.2 EB: more than the address space holds");
    assert!(e.contains(&want), "{e}");
    assert!(!out.exists(), "output written despite the error");
}

#[test]
fn run_weights_that_do_not_fit_in_memory_are_refused() {
    // The report: q, k, v [1, 1, 50000, 4] with --weights under `ulimit -v 4000000` (weights 10 GB).
    let dir = tempfile::tempdir().unwrap();
    let t = f32_tensor(&[1, 1, 50000, 4], 1);
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &t), ("k", &t), ("v", &t)]);
    let out = out_path(dir.path());
    let o = attn_limited(&["run", input.to_str().unwrap(), "--weights", "-o", out.to_str().unwrap()]);
    let e = one_line_error(&o);
    assert!(e.contains("attention weights [1, 1, 50000, 50000] f32 need 10.0 GB: allocation failed"), "{e}");
    assert!(!out.exists(), "output written despite the error");
}

#[test]
fn bench_inputs_beyond_the_address_space_are_refused() {
    let o = Command::new(env!("CARGO_BIN_EXE_attn")).args(["bench", "--shape", "1048576,1048576,1048576,2"]).output();
    let e = one_line_error(&o.unwrap());
    let want = "--shape 1048576,1048576,1048576,2: random values [1048576, 1048576, 1048576, 2] f32 need 9.2 EB";
    assert!(e.contains(want), "{e}");
    // An element count that overflows 64 bits.
    let big = "4294967296,4294967296,4294967296,1";
    let o = Command::new(env!("CARGO_BIN_EXE_attn")).args(["bench", "--shape", big]).output();
    let e = one_line_error(&o.unwrap());
    assert!(e.contains("more than the address space holds"), "{e}");
}

#[test]
fn bench_inputs_that_do_not_fit_in_memory_are_refused() {
    // The report: `attn bench --shape 1000,1000,100000,1000` (q alone 400 TB).
    let e = one_line_error(&attn_limited(&["bench", "--shape", "1000,1000,100000,1000"]));
    let want = "random values [1000, 1000, 100000, 1000] f32 need 400.0 TB: allocation failed";
    assert!(e.contains(want), "{e}");
}
