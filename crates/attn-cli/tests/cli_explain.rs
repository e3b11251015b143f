//! `attn explain` end to end: each experiment prints its table and writes its plots into
//! `--out-dir`; bad arguments are refused before any work, with nothing written. `heads` reads a
//! tiny checkpoint trained by `attn train` in the test (a few seconds).

use std::process::Command;

fn attn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().expect("attn runs")
}

fn is_png(path: &std::path::Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

#[test]
fn additive_vs_dot_prints_a_row_per_length_and_draws_both_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("plots");
    let o = attn(&[
        "explain",
        "additive-vs-dot",
        "--lengths",
        "4,8,16",
        "--batch",
        "2",
        "--dim",
        "8",
        "--iters",
        "2",
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    for l in ["4", "8", "16"] {
        let row = stdout
            .lines()
            .find(|line| line.split_whitespace().next() == Some(l))
            .unwrap_or_else(|| panic!("no row for L = {l}:\n{stdout}"));
        let cells: Vec<f64> = row.split_whitespace().skip(1).map(|c| c.parse().unwrap()).collect();
        assert_eq!(cells.len(), 5, "{row}");
        assert!(cells.iter().all(|&c| c.is_finite() && c >= 0.0), "{row}");
    }
    // Additive attention holds [B, L, L, D] features: at L = 16 that alone is 2·16·16·8·4 bytes.
    let last = stdout.lines().find(|line| line.split_whitespace().next() == Some("16")).unwrap();
    let additive_mib: f64 = last.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(additive_mib * (1u64 << 20) as f64 >= (2 * 16 * 16 * 8 * 4) as f64, "{last}");
    assert!(is_png(&out_dir.join("additive-vs-dot-time.png")) && is_png(&out_dir.join("additive-vs-dot-memory.png")));
}

#[test]
fn bad_arguments_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let o = attn(&["explain", "additive-vs-dot", "--lengths", "8,0", "--out-dir", d]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("must all be positive"));
    let o = attn(&["explain", "additive-vs-dot", "--lengths", "100000", "--out-dir", d]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("GiB of [B, L, L, D] features"));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let o = attn(&["explain", "additive-vs-dot", "--lengths", "4", "--out-dir", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("--out-dir") && err.contains("a-file"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing else was written");
}

/// The row of `stdout` whose first cells are `key`, as numbers after those cells.
fn row(stdout: &str, key: &[&str]) -> Vec<f64> {
    let line = stdout
        .lines()
        .find(|line| line.split_whitespace().take(key.len()).eq(key.iter().copied()))
        .unwrap_or_else(|| panic!("no row {key:?}:\n{stdout}"));
    line.split_whitespace().skip(key.len()).map(|c| c.parse().unwrap_or(f64::NAN)).collect()
}

/// Runs `args`, expecting success; returns standard output.
fn ok(args: &[&str]) -> String {
    let o = attn(args);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{args:?}\n{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    stdout
}

/// Runs `args`, expecting exit code 1 with an error naming each of `needles`; returns stderr.
fn refused(args: &[&str], needles: &[&str]) -> String {
    let o = attn(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert!(needles.iter().all(|n| err.contains(n)), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn scaling_prints_a_row_per_width_and_draws_three_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("plots");
    let d = out_dir.to_str().unwrap();
    let stdout = ok(&["explain", "scaling", "--dims", "4,64,1024", "--trials", "300", "--out-dir", d]);
    for d_k in ["4", "64", "1024"] {
        let cells = row(&stdout, &[d_k]);
        assert_eq!(cells.len(), 8, "{cells:?}");
        assert!(cells.iter().all(|c| c.is_finite() && *c >= 0.0), "{cells:?}");
        assert!((cells[1] - 1.0).abs() < 0.2, "var(q·k)/d_k = {}", cells[1]);
    }
    let last = row(&stdout, &["1024"]);
    // Unscaled: nearly one-hot (low entropy) with a vanishing gradient; scaled: neither.
    assert!(last[2] < 0.5 * last[3] && last[4] < 0.5 * last[5] && last[6] < 1e-2 * last[7], "{last:?}");
    for f in ["scaling-variance.png", "scaling-entropy.png", "scaling-gradient.png"] {
        assert!(is_png(&out_dir.join(f)), "{f}");
    }
}

#[test]
fn scaling_refuses_bad_arguments_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("out");
    let d = d.to_str().unwrap();
    refused(&["explain", "scaling", "--dims", "8,0", "--out-dir", d], &["--dims", "positive"]);
    refused(&["explain", "scaling", "--keys", "1", "--out-dir", d], &["--keys"]);
    refused(&["explain", "scaling", "--trials", "1", "--out-dir", d], &["--trials"]);
    refused(&["explain", "scaling", "--dims", "1000000", "--out-dir", d], &["Gaussian draws"]);
    refused(&["explain", "scaling", "--dims", "four", "--out-dir", d], &["--dims", "four"]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}

#[test]
fn heads_of_a_trained_checkpoint_print_per_head_rows_and_draw_grids() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let m = model.to_str().unwrap();
    let flags = ["--steps", "20", "--d-model", "16", "--heads", "2", "--layers", "1", "--ff", "32"];
    let every = ["--held-out", "20", "--eval-every", "20", "--checkpoint-every", "20"];
    ok(&[&["train", "--out", m][..], &flags, &every].concat());
    let out_dir = dir.path().join("heads");
    let stdout =
        ok(&["explain", "heads", m, "--samples", "10", "--example", "2", "--out-dir", out_dir.to_str().unwrap()]);
    for kind in ["encoder", "decoder", "cross"] {
        for head in ["0", "1"] {
            let cells = row(&stdout, &[kind, "1", head]);
            assert_eq!(cells.len(), 2, "{kind} {head}: {cells:?}");
            assert_eq!(cells[0].is_nan(), kind == "cross", "distance of {kind}: {cells:?}");
            assert!(cells[1] >= 0.0, "entropy of {kind}: {cells:?}");
        }
        let uniform = row(&stdout, &[kind, "uniform"]);
        assert!(uniform[1] > 0.0, "{uniform:?}");
        assert!(is_png(&out_dir.join(format!("heads-{kind}-layer1.png"))), "{kind}");
    }
    assert!(stdout.contains("10 held-out pairs"), "{stdout}");

    let d = dir.path().join("refused");
    let d = d.to_str().unwrap();
    refused(&["explain", "heads", m, "--example", "10", "--samples", "10", "--out-dir", d], &["--example", "10 pairs"]);
    refused(&["explain", "heads", m, "--samples", "0", "--out-dir", d], &["--samples"]);
    let missing = dir.path().join("no-model");
    refused(&["explain", "heads", missing.to_str().unwrap(), "--out-dir", d], &["no-model"]);
    refused(&["explain", "heads", "--out-dir", d], &["CHECKPOINT"]);
    assert!(!dir.path().join("refused").exists(), "nothing was written");
}

#[test]
fn classify_trains_prints_accuracy_and_draws_its_attention() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("classify");
    let flags = ["--steps", "40", "--train-size", "200", "--test-size", "100", "--eval-every", "20"];
    let stdout = ok(&[&["explain", "classify", "--out-dir", out_dir.to_str().unwrap()][..], &flags].concat());
    for step in ["20", "40"] {
        let cells = row(&stdout, &[step]);
        assert_eq!(cells.len(), 3, "{cells:?}");
        assert!(cells[0] > 0.0 && (0.0..=100.0).contains(&cells[1]) && (0.0..=100.0).contains(&cells[2]), "{cells:?}");
    }
    assert!(stdout.contains("test accuracy") && stdout.contains("chance 50%"), "{stdout}");
    assert!(is_png(&out_dir.join("classify-accuracy.png")) && is_png(&out_dir.join("classify-attention.png")));
}

#[test]
fn classify_refuses_bad_arguments_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("out");
    let d = d.to_str().unwrap();
    refused(&["explain", "classify", "--min-len", "1", "--out-dir", d], &["--min-len"]);
    refused(&["explain", "classify", "--max-len", "100000", "--out-dir", d], &["--max-len", "512"]);
    refused(&["explain", "classify", "--lr", "0", "--out-dir", d], &["--lr"]);
    refused(&["explain", "classify", "--batch", "0", "--out-dir", d], &["--batch"]);
    refused(&["explain", "classify", "--steps", "0", "--out-dir", d], &["--steps"]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}

#[test]
fn sparse_draws_every_pattern_and_sweeps_time_and_memory() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("sparse");
    let d = out_dir.to_str().unwrap();
    let flags = ["--picture-len", "128", "--lengths", "128,256", "--dense-max", "128", "--iters", "1"];
    let stdout = ok(&[&["explain", "sparse", "--threads", "2", "--out-dir", d][..], &flags].concat());
    for name in ["strided", "fixed", "longformer", "bigbird", "document", "prefix-lm", "sinks"] {
        assert!(is_png(&out_dir.join(format!("sparse-{name}.png"))), "{name}");
        let line = stdout.lines().find(|l| l.trim_start().starts_with(&format!("{name} "))).unwrap();
        assert!(line.contains("% of blocks"), "{line}");
    }
    assert!(stdout.contains("document doc_lengths=24,40,16,48"), "{stdout}");
    for (l, series) in [("128", &["dense"][..]), ("128", &["window", "±128"]), ("256", &["bigbird"])] {
        let cells = row(&stdout, &[&[l][..], series].concat());
        // blocks, build ms (or "-" for dense), forward ms, memory and its unit.
        assert!(cells[0] > 0.0 && cells[0] <= 1.0 && cells[2] > 0.0 && cells[3] > 0.0, "{l} {series:?}: {cells:?}");
    }
    let strided = row(&stdout, &["256", "strided,", "stride", "≈", "√L"]);
    assert!(strided[0] < 1.0, "{strided:?}");
    assert!(!stdout.lines().any(|l| l.split_whitespace().take(2).eq(["256", "dense"])), "dense stops at 128");
    assert!(stdout.contains("fitted slopes of log time") && stdout.contains("window ±128 (slope "), "{stdout}");
    assert!(is_png(&out_dir.join("sparse-time.png")) && is_png(&out_dir.join("sparse-memory.png")));
}

#[test]
fn sparse_refuses_bad_arguments_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("out");
    let d = d.to_str().unwrap();
    refused(&["explain", "sparse", "--picture-len", "32", "--out-dir", d], &["--picture-len 32", "64 to 4096"]);
    refused(&["explain", "sparse", "--lengths", "128,0", "--out-dir", d], &["--lengths", "positive"]);
    refused(&["explain", "sparse", "--iters", "0", "--out-dir", d], &["--iters"]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was written");
}
