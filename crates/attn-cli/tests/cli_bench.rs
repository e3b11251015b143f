//! `attn bench` end to end: the JSON lines it prints (fields, FLOP count, GFLOP/s consistency)
//! and its one-line errors for bad shapes and options.

use std::process::{Command, Output};

use serde_json::Value;

fn attn_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).arg("bench").args(args).output().expect("attn runs")
}

fn json_lines(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone())
        .expect("utf-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line {l:?} is not JSON: {e}")))
        .collect()
}

/// FLOPs by the documented rule, counted pair by pair: query `i` may see key `j` iff `j <= i`
/// (causal, top-left) and each allowed pair costs `2·Dk + 2·Dv`.
fn expected_flops(b: u64, h: u64, lq: u64, lk: u64, dk: u64, dv: u64, causal: bool) -> u64 {
    let mut pairs = 0;
    for i in 0..lq {
        for j in 0..lk {
            if !causal || j <= i {
                pairs += 1;
            }
        }
    }
    b * h * pairs * (2 * dk + 2 * dv)
}

#[test]
fn causal_json_row_counts_flops_exactly() {
    let out = attn_bench(&[
        "--shape",
        "2,4,9,8",
        "--kv-len",
        "6",
        "--kv-heads",
        "2",
        "--dv",
        "4",
        "--causal",
        "--kv-dtype",
        "bf16",
        "--threads",
        "2",
        "--kernel",
        "reference",
        "--warmup",
        "0",
        "--iters",
        "3",
        "--json",
    ]);
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    let flops = expected_flops(2, 4, 9, 6, 8, 4, true);
    assert_eq!(r["flops"].as_u64(), Some(flops));
    assert_eq!(r["shape"], "2,4,9,8");
    assert_eq!((r["kv_len"].as_u64(), r["kv_heads"].as_u64(), r["dv"].as_u64()), (Some(6), Some(2), Some(4)));
    assert_eq!((r["kernel"].as_str(), r["kv_dtype"].as_str()), (Some("reference"), Some("bf16")));
    assert_eq!((r["causal"].as_bool(), r["threads"].as_u64(), r["iters"].as_u64()), (Some(true), Some(2), Some(3)));
    let (median, min, max) =
        (r["median_s"].as_f64().unwrap(), r["min_s"].as_f64().unwrap(), r["max_s"].as_f64().unwrap());
    assert!(0.0 < min && min <= median && median <= max, "{r}");
    let gflops = r["gflops"].as_f64().unwrap();
    assert!(gflops > 0.0);
    let implied = flops as f64 / median / 1e9;
    assert!((gflops - implied).abs() <= 1e-9 * implied, "gflops {gflops} vs flops/median {implied}");
    assert!(r["extra_bytes"].is_u64(), "{r}");
}

#[test]
fn one_json_line_per_shape_and_full_attention_is_4bhld() {
    let out = attn_bench(&["--shape", "1,2,5,4", "--shape", "3,1,7,2", "--iters", "2", "--warmup", "0", "--json"]);
    let rows = json_lines(&out);
    let shapes: Vec<_> = rows.iter().map(|r| r["shape"].as_str().unwrap().to_string()).collect();
    assert_eq!(shapes, ["1,2,5,4", "3,1,7,2"]);
    assert_eq!(rows[0]["flops"].as_u64(), Some(4 * 2 * 5 * 5 * 4));
    assert_eq!(rows[1]["flops"].as_u64(), Some(expected_flops(3, 1, 7, 7, 2, 2, false)));
    assert!(rows.iter().all(|r| r["gflops"].as_f64().unwrap() > 0.0 && r["iters"].as_u64() == Some(2)));
}

#[test]
fn table_output_has_a_header_and_a_row_per_shape() {
    let out = attn_bench(&["--shape", "1,1,3,2", "--shape", "1,1,4,2", "--iters", "1", "--warmup", "0"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains("GFLOP/s") && lines[1].starts_with("1,1,3,2") && lines[2].starts_with("1,1,4,2"));
}

fn assert_one_line_error(args: &[&str], needle: &str) {
    let out = attn_bench(args);
    assert_eq!(out.status.code(), Some(1), "args {args:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
}

#[test]
fn bad_shapes_and_options_fail_with_one_line() {
    assert_one_line_error(&["--shape", "1,2,x,4"], "'1,2,x,4'");
    assert_one_line_error(&["--shape", "1,2,3"], "expected 4");
    assert_one_line_error(&["--shape", "1,2,0,4"], "Lq");
    assert_one_line_error(&["--shape", "1,6,4,4", "--kv-heads", "4"], "--kv-heads 4");
    assert_one_line_error(&["--shape", "1,1,4,4", "--threads", "0"], "--threads");
    assert_one_line_error(&[], "--shape");
    assert_one_line_error(&["--shape", "1,1,4,4", "--softcap", "0"], "softcap");
}

#[test]
fn softcap_is_run_and_reported() {
    let out = attn_bench(&["--shape", "1,2,5,4", "--softcap", "30", "--iters", "1", "--warmup", "0", "--json"]);
    let rows = json_lines(&out);
    assert_eq!(rows[0]["softcap"].as_f64(), Some(30.0));
    let out = attn_bench(&["--shape", "1,2,5,4", "--iters", "1", "--warmup", "0", "--json"]);
    assert!(json_lines(&out)[0]["softcap"].is_null());
}

/// The one JSON row of `--shape 2,4,9,8 --kv-len 6 --kv-heads 2 --dv 4 --causal` plus `extra`.
fn causal_gqa_row(extra: &[&str]) -> Value {
    let base = ["--shape", "2,4,9,8", "--kv-len", "6", "--kv-heads", "2", "--dv", "4", "--causal"];
    let rest = ["--threads", "2", "--warmup", "0", "--iters", "2", "--json"];
    let rows = json_lines(&attn_bench(&[&base[..], extra, &rest].concat()));
    assert_eq!(rows.len(), 1);
    rows.into_iter().next().unwrap()
}

#[test]
fn backward_json_counts_three_and_a_half_forwards() {
    let forward = causal_gqa_row(&[]);
    let backward = causal_gqa_row(&["--backward"]);
    let forward_flops = expected_flops(2, 4, 9, 6, 8, 4, true);
    assert_eq!(forward["flops"].as_u64(), Some(forward_flops));
    assert_eq!(backward["flops"].as_u64(), Some(forward_flops * 7 / 2), "{backward}");
    assert_eq!((forward["backward"].as_bool(), backward["backward"].as_bool()), (Some(false), Some(true)));
    assert_eq!(backward["autograd"].as_bool(), Some(false));
    let (median, gflops) = (backward["median_s"].as_f64().unwrap(), backward["gflops"].as_f64().unwrap());
    let implied = (forward_flops * 7 / 2) as f64 / median / 1e9;
    assert!(median > 0.0 && (gflops - implied).abs() <= 1e-9 * implied, "{backward}");
    // Full attention too: 3.5 · 4·B·H·L·L·D.
    let out = attn_bench(&["--shape", "1,2,5,4", "--backward", "--iters", "1", "--warmup", "0", "--json"]);
    assert_eq!(json_lines(&out)[0]["flops"].as_u64(), Some(4 * 2 * 5 * 5 * 4 * 7 / 2));
}

#[test]
fn backward_with_dropout_runs_by_the_kernels_and_through_autograd() {
    for path in [&[][..], &["--autograd"]] {
        let r = causal_gqa_row(&[&["--backward", "--dropout", "0.1", "--kv-dtype", "f16"][..], path].concat());
        assert!((r["dropout"].as_f64().unwrap() - 0.1).abs() < 1e-6, "{r}");
        assert_eq!((r["backward"].as_bool(), r["autograd"].as_bool()), (Some(true), Some(!path.is_empty())));
        assert!(r["gflops"].as_f64().unwrap() > 0.0 && r["iters"].as_u64() == Some(2), "{r}");
    }
}

#[test]
fn backward_table_states_the_flop_rule_above_the_header() {
    let out = attn_bench(&["--shape", "1,1,4,2", "--backward", "--iters", "1", "--warmup", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].contains("backward") && lines[0].contains("3.5 x forward"), "{text}");
    assert!(lines[1].contains("GFLOP/s") && lines[2].starts_with("1,1,4,2"), "{text}");
    assert_one_line_error(&["--shape", "1,1,4,2", "--autograd"], "--backward");
}

#[test]
fn bf16_products_are_run_and_reported() {
    let args = ["--shape", "1,2,70,8", "--kv-dtype", "bf16", "--iters", "1", "--warmup", "0"];
    let rows = json_lines(&attn_bench(&[&args[..], &["--compute", "bf16", "--json"]].concat()));
    assert_eq!(rows[0]["compute"], "bf16");
    assert_eq!(json_lines(&attn_bench(&[&args[..], &["--json"]].concat()))[0]["compute"], "f32");
    let table = attn_bench(&[&args[..], &["--compute", "bf16"]].concat());
    assert!(String::from_utf8_lossy(&table.stdout).contains("+bf16"), "the table names the products");
    // A decode-shaped call (one query row per key/value head) computes in f32 whatever is asked.
    let decode = ["--shape", "1,2,1,8", "--kv-len", "70", "--kv-dtype", "bf16", "--iters", "1", "--warmup", "0"];
    let rows = json_lines(&attn_bench(&[&decode[..], &["--compute", "bf16", "--json"]].concat()));
    assert_eq!(rows[0]["compute"], "f32", "the decode path's products");
    let table = attn_bench(&[&decode[..], &["--compute", "bf16"]].concat());
    assert!(!String::from_utf8_lossy(&table.stdout).contains("+bf16"), "a decode row names no bf16 products");
    // Packed sequences each run as a call of their own: a sequence of 1 query decodes in f32.
    let packed = ["--shape", "3,2,70,8", "--kv-dtype", "bf16", "--iters", "1", "--warmup", "0", "--compute", "bf16"];
    for (lens, compute, decoding, text) in [
        ("70,1,40", "bf16", 1, "+bf16 (f32: 1 of 3 decode-length sequences)"),
        ("1,2,1", "f32", 3, ""),
        ("70,64,40", "bf16", 0, "+bf16 "),
    ] {
        let rows = json_lines(&attn_bench(&[&packed[..], &["--seq-lens", lens, "--json"]].concat()));
        assert_eq!(
            (rows[0]["compute"].as_str(), rows[0]["decode_f32_calls"].as_u64()),
            (Some(compute), Some(decoding))
        );
        // Head dimension 8 never fits the AMX tiles (multiples of 32), whatever the CPU.
        assert_eq!(rows[0]["amx_calls"].as_u64(), Some(0), "--seq-lens {lens}");
        let table =
            String::from_utf8_lossy(&attn_bench(&[&packed[..], &["--seq-lens", lens]].concat()).stdout).to_string();
        assert_eq!(table.contains("+bf16"), !text.is_empty(), "--seq-lens {lens}: {table}");
        assert!(table.contains(text), "--seq-lens {lens}: {table}");
    }
    // Padded, the same lengths are one prefill call.
    let rows = json_lines(&attn_bench(&[&packed[..], &["--seq-lens", "1,2,1", "--padded", "--json"]].concat()));
    assert_eq!(rows[0]["compute"], "bf16");
    assert_one_line_error(&["--shape", "1,2,5,4", "--compute", "f8"], "f8");
}

#[test]
fn linear_rows_say_whether_the_outputs_were_reused() {
    for (extra, want) in [(None, "fresh"), (Some("--reuse-outputs"), "reused")] {
        let mut args = vec!["--linear", "elu", "--causal", "--backward", "--shape", "1,2,70,8", "--threads", "2"];
        args.extend(["--warmup", "1", "--iters", "2", "--json"]);
        args.extend(extra);
        let rows = json_lines(&attn_bench(&args));
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0]["outputs"].as_str(), rows[0]["iters"].as_u64()), (Some(want), Some(2)));
    }
    // Only linear attention has caller-kept outputs.
    let out = attn_bench(&["--shape", "1,1,8,8", "--reuse-outputs"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--linear"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `--delta-rule`: a row per shape with the FLOPs of the printed rule for both gates, counted chunk
/// by chunk here (T = 70: one chunk of 64 tokens and one of 6), and refusals of what the rule does
/// not take.
#[test]
fn delta_rule_rows_count_the_chunked_flops() {
    let (dk, dv) = (8u64, 4u64);
    let fwd = |n: u64| 6 * n * dk * dv + 2 * n * n * (dk + dv) + n * n * n / 3;
    let bwd = |n: u64| 14 * n * dk * dv + 4 * n * n * (dk + dv);
    for (backward, per_head) in [(false, fwd(64) + fwd(6)), (true, 2 * (fwd(64) + fwd(6)) + bwd(64) + bwd(6))] {
        let mut args = vec!["--delta-rule", "gated", "--shape", "2,4,70,8", "--kv-heads", "2", "--dv", "4"];
        args.extend(["--threads", "2", "--iters", "2", "--json"]);
        if backward {
            args.push("--backward");
        }
        let rows = json_lines(&attn_bench(&args));
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r["delta_rule"].as_str(), r["key_heads"].as_u64(), r["backward"].as_bool()),
            (Some("gated"), Some(2), Some(backward))
        );
        assert_eq!(r["flops"].as_u64(), Some(2 * 4 * per_head), "{r}");
        let gflops = r["flops"].as_f64().unwrap() / r["median_s"].as_f64().unwrap() / 1e9;
        assert!((r["gflops"].as_f64().unwrap() - gflops).abs() <= 1e-9 * gflops.max(1.0), "{r}");
    }
    // KDA by the same chunks (its factorised products have the scalar gate's shapes): T = 9, Dv = Dk.
    let kda = json_lines(&attn_bench(&["--delta-rule", "kda", "--shape", "1,2,9,8", "--iters", "1", "--json"]));
    let chunk9 = 6 * 9 * 8 * 8 + 2 * 9 * 9 * (8 + 8) + 9 * 9 * 9 / 3;
    assert_eq!(kda[0]["flops"].as_u64(), Some(2 * chunk9));
    let out = attn_bench(&["--delta-rule", "gated", "--shape", "1,2,8,8", "--causal"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--causal"));
    let out = attn_bench(&["--delta-rule", "gated", "--shape", "1,2,8,8", "--kv-heads", "3"]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
