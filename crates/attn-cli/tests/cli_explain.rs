//! `attn explain` end to end: each experiment prints its table and writes its plots into
//! `--out-dir`; bad arguments are refused before any work, with nothing written.

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
