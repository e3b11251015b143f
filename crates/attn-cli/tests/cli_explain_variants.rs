//! `attn explain variants` end to end at a tiny size: it writes its four plots and `variants.md`
//! (the complexity table with a row per variant and fitted slopes, a row per measured case, the
//! FAVOR+ error table), skips the reference kernel beyond `--dense-max` and the quadratic series'
//! backward beyond `--quadratic-backward-max`, and refuses bad lengths before writing anything.

use std::process::Command;

fn attn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().expect("attn runs")
}

fn is_png(path: &std::path::Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

/// The table rows of `md` whose first cell is `first`.
fn rows<'a>(md: &'a str, first: &str) -> Vec<Vec<&'a str>> {
    md.lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells[0] == first)
        .collect()
}

#[test]
fn variants_sweeps_writes_its_plots_and_tables() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("variants");
    let d = out.to_str().unwrap();
    let flags = ["--min-len", "64", "--max-len", "128", "--dense-max", "64", "--quadratic-backward-max", "64"];
    let small = ["--heads", "2", "--dim", "16", "--iters", "1", "--favor-len", "64", "--favor-max-features", "32"];
    let args = [&["explain", "variants"][..], &flags, &small, &["--threads", "2", "--out-dir", d]].concat();
    let o = attn(&args);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    for f in
        ["variants-forward.png", "variants-forward-backward.png", "variants-memory.png", "variants-favor-error.png"]
    {
        assert!(is_png(&out.join(f)), "{f}");
    }
    // A row per case and per feature count on standard output, though no bar is drawn there.
    let printed = |needles: &[&str]| stdout.lines().filter(|l| needles.iter().all(|n| l.contains(n))).count();
    assert_eq!(printed(&["128", "linear elu+1", "forward + backward"]), 1, "{stdout}");
    assert_eq!(printed(&["features: relative error"]), 2, "{stdout}");
    let md = std::fs::read_to_string(out.join("variants.md")).unwrap();
    // The complexity table: one row per variant, the seed table's column beside slopes fitted
    // over the two lengths (the reference has one point per pass at most, so no slope).
    let flash = rows(&md, "flash");
    assert_eq!(flash.len(), 1, "{md}");
    assert_eq!(flash[0][1], "O(L²·D)");
    assert!(flash[0][3].parse::<f64>().is_ok(), "{:?}", flash[0]);
    assert_eq!(rows(&md, "exact reference")[0][3], "-");
    for v in [
        "sliding window 256",
        "strided sparse, stride ≈ √L",
        "linear elu+1",
        "linear FAVOR+ 64",
        "linear FAVOR+ 256",
        "gated delta rule",
    ] {
        assert_eq!(rows(&md, v).len(), 1, "{v}: {md}");
    }
    // The points: 8 variants × 2 passes at L = 64; at 128 no reference and no flash backward.
    assert_eq!(rows(&md, "64").len(), 16, "{md}");
    assert_eq!(rows(&md, "128").len(), 13, "{md}");
    assert_eq!(printed(&["128", "gated delta rule", "forward + backward"]), 1, "{stdout}");
    assert!(rows(&md, "128").iter().all(|r| r[1] != "exact reference"));
    // FAVOR+'s errors: 16 and 32 features, finite and below 1.
    for m in ["16", "32"] {
        let r = rows(&md, m);
        assert_eq!(r.len(), 1, "{m}: {md}");
        let e: f64 = r[0][1].parse().unwrap();
        assert!(e > 0.0 && e < 1.0, "{m} features: error {e}");
    }
}

#[test]
fn variants_refuses_bad_lengths_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("variants");
    let o = attn(&["explain", "variants", "--min-len", "512", "--max-len", "256", "--out-dir", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("--min-len 512") && stderr.contains("--max-len 256"), "{stderr}");
    assert!(!out.exists());
}
