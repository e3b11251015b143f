//! `attn bench --pattern`: FLOPs counted on the pairs the pattern (and the band) allows, checked
//! pair by pair here; the fractions of 64×64 blocks computed and partial; the mask's building time
//! and bytes reported apart; forward and backward; `--vs-full`'s f, rounds and ratio; refusals naming the
//! flag and the shape.

use std::process::{Command, Output};

use attn::sparse::{Pattern, SPARSE_BLOCK};
use attn::Window;
use serde_json::Value;

fn attn_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).arg("bench").args(args).output().expect("attn runs")
}

/// The one JSON row of `attn bench --shape SHAPE FLAGS --json` (2 calls, no warm-up).
fn row(shape: &str, flags: &[&str]) -> Value {
    let rest = ["--threads", "2", "--warmup", "0", "--iters", "2", "--json"];
    let out = attn_bench(&[&["--shape", shape][..], flags, &rest].concat());
    assert!(out.status.success(), "{flags:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 1, "{text}");
    rows.into_iter().next().unwrap()
}

/// Pairs of an `l × l` self-attention that `allowed` allows, and the fractions of 64×64 blocks
/// holding at least one of them and holding some but not all.
fn count(l: usize, allowed: impl Fn(usize, usize) -> bool) -> (u64, f64, f64) {
    let nb = l.div_ceil(SPARSE_BLOCK);
    let mut kept = vec![0usize; nb * nb];
    let mut pairs = 0;
    for i in 0..l {
        for j in 0..l {
            if allowed(i, j) {
                pairs += 1;
                kept[i / SPARSE_BLOCK * nb + j / SPARSE_BLOCK] += 1;
            }
        }
    }
    let size = |x: usize| SPARSE_BLOCK.min(l - x * SPARSE_BLOCK);
    let partial = (0..nb * nb).filter(|&x| kept[x] > 0 && kept[x] < size(x / nb) * size(x % nb)).count();
    let any = kept.iter().filter(|&&n| n > 0).count();
    (pairs, any as f64 / (nb * nb) as f64, partial as f64 / (nb * nb) as f64)
}

#[test]
fn longformer_counts_its_allowed_pairs_and_blocks_and_reports_its_mask() {
    // L = 300: five blocks, the last cut short; B = 2, H = 3, D = 8 (4·D FLOPs per pair).
    let flags = ["--pattern", "longformer", "--window", "20,10", "--global", "5"];
    let r = row("2,3,300,8", &flags);
    let longformer = |i: usize, j: usize| (j + 20 >= i && j <= i + 10) || i < 5 || j < 5;
    let (pairs, blocks, partial) = count(300, longformer);
    assert_eq!(r["flops"].as_u64(), Some(pairs * 4 * 8 * 2 * 3), "{r}");
    let pattern = Pattern::Longformer { window: Window { left: Some(20), right: Some(10) }, global: 5 };
    let mask = pattern.block_mask(300, 300).unwrap();
    // Every listed block holds an allowed pair here, so both fractions agree with the count.
    assert!((r["blocks"].as_f64().unwrap() - blocks).abs() < 1e-12, "{r}");
    assert!((r["partial_blocks"].as_f64().unwrap() - partial).abs() < 1e-12 && partial > 0.0, "{r}");
    assert!((r["density"].as_f64().unwrap() - mask.density()).abs() < 1e-12, "{r}");
    assert_eq!(r["mask_bytes"].as_u64(), Some(mask.bytes() as u64));
    assert!(r["mask_build_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["pattern"].as_str(), Some("longformer window=20,10 global=5"));
    // The window is the pattern's, not a band of its own.
    assert!(r["window"].is_null(), "{r}");
    let gflops = r["gflops"].as_f64().unwrap();
    let implied = r["flops"].as_f64().unwrap() / r["median_s"].as_f64().unwrap() / 1e9;
    assert!((gflops - implied).abs() <= 1e-9 * implied, "{r}");
}

#[test]
fn causal_composes_with_the_pattern_in_pairs_and_blocks() {
    let r = row("1,2,256,8", &["--pattern", "prefix-lm", "--prefix", "100", "--causal"]);
    // Prefix-LM AND causal is causal: the prefix's future is cut.
    let (pairs, blocks, _) = count(256, |i, j| j <= i);
    assert_eq!(r["flops"].as_u64(), Some(pairs * 4 * 8 * 2), "{r}");
    assert!((r["blocks"].as_f64().unwrap() - blocks).abs() < 1e-12, "{r}");
    // The mask alone lists more: the prefix's blocks above the diagonal.
    let (_, prefix_blocks, _) = count(256, |i, j| j < 100 || j <= i);
    assert!((r["density"].as_f64().unwrap() - prefix_blocks).abs() < 1e-12, "{r}");
    // Without a pattern the block fraction is the band's.
    let causal = row("1,2,256,8", &["--causal"]);
    assert!((causal["blocks"].as_f64().unwrap() - blocks).abs() < 1e-12 && causal["pattern"].is_null(), "{causal}");
}

#[test]
fn every_pattern_runs_forward_and_backward() {
    let cases: [&[&str]; 7] = [
        &["--pattern", "strided", "--stride", "16"],
        &["--pattern", "fixed", "--stride", "64", "--summary", "4"],
        &["--pattern", "longformer", "--window", "32,32", "--global", "4"],
        &["--pattern", "bigbird", "--window", "32,32", "--global", "4", "--random", "1", "--seed", "3"],
        &["--pattern", "document", "--doc-lengths", "100,92,64"],
        &["--pattern", "prefix-lm", "--prefix", "30"],
        &["--pattern", "sinks", "--sink-tokens", "4", "--window", "63,0"],
    ];
    for flags in cases {
        for backward in [&[][..], &["--backward"]] {
            let r = row("1,2,256,16", &[flags, backward].concat());
            let (f, d) = (r["flops"].as_u64().unwrap(), r["density"].as_f64().unwrap());
            assert!(f > 0 && f < 4 * 16 * 256 * 256 * 2 * 4 && d > 0.0 && d < 1.0, "{flags:?} {backward:?}: {r}");
            assert_eq!(r["backward"].as_bool(), Some(!backward.is_empty()));
        }
    }
}

#[test]
fn the_table_gains_the_pattern_columns() {
    let args = ["--shape", "1,1,128,8", "--pattern", "strided", "--stride", "8", "--iters", "1", "--warmup", "0"];
    let out = attn_bench(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].ends_with("blocks partial  build ms       mask  pattern"), "{text}");
    // Stride 8 puts a stride column in every block at or below the diagonal: 3 of 4, all partial.
    assert!(lines[1].ends_with("strided stride=8") && lines[1].contains(" 0.7500  0.7500 "), "{text}");
    let plain =
        String::from_utf8(attn_bench(&args[..2].iter().chain(&args[6..]).copied().collect::<Vec<_>>()).stdout).unwrap();
    assert!(!plain.contains("pattern") && !plain.contains("build ms"), "{plain}");
}

#[test]
fn refusals_name_the_flag_and_the_shape() {
    for (args, wanted) in [
        (
            &["--shape", "1,1,128,8", "--pattern", "document", "--doc-lengths", "64,32"][..],
            &["--doc-lengths", "sum to 96", "--shape 1,1,128,8"][..],
        ),
        (
            &["--shape", "1,1,128,8", "--pattern", "bigbird", "--window", "4,4", "--global", "1"],
            &["--random", "needs it"],
        ),
        (&["--shape", "1,1,128,8", "--stride", "4"], &["--pattern"]),
        // Packed sequences take no block mask.
        (
            &["--shape", "1,1,128,8", "--seq-lens", "64", "--pattern", "strided", "--stride", "4"],
            &["--seq-lens", "--pattern"],
        ),
    ] {
        let out = attn_bench(args);
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!((out.status.code(), err.lines().count()), (Some(1), 1), "{args:?}: {err}");
        for w in wanted {
            assert!(err.starts_with("error: ") && err.contains(w), "{args:?}: {w:?} not in {err}");
        }
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn vs_full_reports_f_its_rounds_and_their_ratio() {
    let (shape, pattern) = ("1,2,512,8", ["--pattern", "longformer", "--window", "16,16", "--global", "4", "--causal"]);
    // f is the pattern's computed blocks over the full (causal) call's, as the plain rows give them.
    let f = row(shape, &pattern)["blocks"].as_f64().unwrap() / row(shape, &["--causal"])["blocks"].as_f64().unwrap();
    for backward in [&[][..], &["--backward"]] {
        let r = row(shape, &[&pattern[..], &["--vs-full", "--rounds", "3"], backward].concat());
        assert!((r["f"].as_f64().unwrap() - f).abs() < 1e-12 && f > 0.0 && f < 1.0, "{r}");
        let times = |k: &str| -> Vec<f64> { r[k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
        let (full, pat) = (times("full_round_s"), times("pattern_round_s"));
        assert!(full.len() == 3 && pat.len() == 3 && full.iter().chain(&pat).all(|&t| t > 0.0), "{r}");
        let mut ratios: Vec<f64> = pat.iter().zip(&full).map(|(p, f)| p / f).collect();
        ratios.sort_by(f64::total_cmp);
        let ratio = r["ratio"].as_f64().unwrap();
        assert!((ratio - ratios[1]).abs() < 1e-12, "the median of the rounds' ratios: {r}");
        assert!((r["ratio_over_f"].as_f64().unwrap() - ratio / f).abs() < 1e-9, "{r}");
        assert_eq!(r["backward"].as_bool(), Some(!backward.is_empty()));
    }
    let out = attn_bench(&["--shape", shape, "--pattern", "strided", "--stride", "16", "--vs-full", "--iters", "1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().next().unwrap().contains("ratio/f") && text.lines().count() == 2, "{text}");
    for (args, wanted) in [
        (&["--shape", shape, "--vs-full"][..], "--pattern"),
        (&["--shape", shape, "--pattern", "strided", "--stride", "16", "--vs-full", "--rounds", "0"], "--rounds"),
    ] {
        let out = attn_bench(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(wanted), "{args:?}: {err}");
    }
}
