//! The real models against transformers' golden outputs on the same weights
//! (`scripts/model_fixtures.py`, float64 model as the oracle): MiniLM's token ids and sentence
//! embeddings; SmolLM2's and Gemma 3's token ids, chat prompt (SmolLM2), prefill logits, greedy
//! continuations (Gemma 3's past its 512-key sliding window) and perplexity; the decode path (one
//! token against the cache) against re-running the whole sequence; the head scores against those
//! from transformers' attention weights; the same through paged caches (f32: the same checks;
//! int8 and fp8: SmolLM2's perplexity within 0.5% and 2% of the f32 cache's); with bf16 products
//! ([`Weights::Bf16`], [`Weights::Int8`]) MiniLM's embeddings and SmolLM2's perplexity close to
//! the float64 model's.
//! The models are fetched into the cache
//! (`attn_models::fetch`) on first use.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use attn::cache::KvDtype;
use attn_models::fetch::KnownModel;
use attn_models::heads::{AttentionWeights, HeadScores};
use attn_models::{greedy, mean_nll, Decoder, SentenceEncoder, Stop, Weights};
use serde_json::Value;

/// The fixture `name` of `tests/fixtures`.
fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The known model `name`, fetched once per process (tests run in parallel threads).
fn model_path(name: &str) -> PathBuf {
    static FETCH: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    KnownModel::named(name).unwrap().fetch().unwrap()
}

fn smollm2() -> &'static Decoder {
    static MODEL: OnceLock<Decoder> = OnceLock::new();
    MODEL.get_or_init(|| Decoder::open(&model_path("smollm2")).unwrap())
}

fn gemma3() -> &'static Decoder {
    static MODEL: OnceLock<Decoder> = OnceLock::new();
    MODEL.get_or_init(|| Decoder::open(&model_path("gemma3")).unwrap())
}

fn minilm() -> &'static SentenceEncoder {
    static MODEL: OnceLock<SentenceEncoder> = OnceLock::new();
    MODEL.get_or_init(|| SentenceEncoder::load(&model_path("minilm")).unwrap())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The oracle rule: `max|ours − ref64| ≤ 2·err32 + floor`, `err32` being transformers' float32
/// model's own error against its float64 one.
fn assert_oracle(what: &str, ours: &[f32], ref64: &[f64], err32: f64, floor: f64) {
    assert_eq!(ours.len(), ref64.len(), "{what}: sizes");
    let err = ours.iter().zip(ref64).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
    let bound = 2.0 * err32 + floor;
    assert!(err <= bound, "{what}: max|attn − ref64| = {err:e} > 2·{err32:e} + {floor:e}");
    eprintln!("{what}: max|attn − ref64| = {err:e} (bound {bound:e})");
}

#[test]
fn minilm_token_ids_equal_transformers() {
    let fx = fixture("minilm.json");
    let texts: Vec<&str> = fx["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let want: Vec<Vec<u32>> = fx["ids"].as_array().unwrap().iter().map(ids).collect();
    assert_eq!(minilm().tokenize(&texts).unwrap(), want);
}

#[test]
fn minilm_embeddings_pass_the_oracle_rule() {
    let fx = fixture("minilm.json");
    let texts: Vec<&str> = fx["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let ours = minilm().embed(&texts).unwrap();
    assert_eq!(ours.dims(), &[texts.len(), 384]);
    let ours: Vec<f32> = ours.flatten_all().unwrap().to_vec1().unwrap();
    let want: Vec<f64> = fx["embeddings"].as_array().unwrap().iter().flat_map(floats).collect();
    // Floor: one f32 rounding of entries of unit-norm vectors (|x| < 1).
    assert_oracle("MiniLM embeddings", &ours, &want, fx["err32_embeddings"].as_f64().unwrap(), 1e-7);
    // Each text alone (no padding) gives the same embedding as in the padded batch.
    let alone: Vec<f32> = minilm().embed(&texts[7..8]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_oracle("MiniLM embedding alone", &alone, &want[7 * 384..], fx["err32_embeddings"].as_f64().unwrap(), 1e-7);
}

/// A decoder's token ids (and chat prompts) against its fixture's.
fn assert_tokenizer(d: &Decoder, fx: &Value) {
    let tok = &d.tokenizer;
    for case in fx["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text).unwrap(), want, "ids of {text:?}");
        // Without the beginning-of-sequence id the tokenizer adds (what it gives for "").
        let added = tok.encode("").unwrap();
        let body = want.strip_prefix(added.as_slice()).unwrap_or(&want);
        assert_eq!(tok.decode(body).unwrap(), text, "decoding the ids of {text:?}");
    }
    for chat in fx["chats"].as_array().unwrap() {
        let template = tok.chat.as_ref().expect("the fixture has chats, so the model a template");
        let message = chat["message"].as_str().unwrap();
        assert_eq!(template.render(&[("user", message)]), chat["text"].as_str().unwrap());
        assert_eq!(d.prompt(message, true).unwrap(), ids(&chat["ids"]));
    }
}

/// A decoder's prefill logits (sampled columns) under the oracle rule.
fn assert_prefill(d: &Decoder, fx: &Value, what: &str) {
    let fx = &fx["prefill"];
    let m = &d.model;
    let logits = m.forward(&ids(&fx["ids"]), &mut m.new_cache().unwrap()).unwrap();
    let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    let stride = fx["stride"].as_u64().unwrap() as usize;
    let ours: Vec<f32> = rows.iter().flat_map(|r| r.iter().step_by(stride).copied()).collect();
    let want: Vec<f64> = fx["logits"].as_array().unwrap().iter().flat_map(floats).collect();
    assert_oracle(&format!("{what} prefill logits"), &ours, &want, fx["err32"].as_f64().unwrap(), 1e-5);
}

/// A decoder's greedy continuations equal the float64 model's, up to the first near-tie.
fn assert_greedy(d: &Decoder, fx: &Value) {
    for g in fx["generations"].as_array().unwrap() {
        let want = ids(&g["ids"]);
        let gaps = floats(&g["gaps"]);
        // Up to the first step where the oracle's top two logits are within 1e-4 (a tie that
        // rounding may break either way).
        let n = gaps.iter().position(|&gap| gap < 1e-4).unwrap_or(want.len());
        let stop = Stop { max_new_tokens: n, eos: None };
        let got = greedy(&d.model, &ids(&g["prompt_ids"]), stop, |_| Ok(())).unwrap();
        assert_eq!(got.ids, want[..n], "greedy continuation `{}`", g["name"]);
    }
}

/// Decoding one token at a time against the cache equals re-running the whole sequence, for
/// `steps` tokens after the prompt of the fixture's last (long) generation.
fn assert_decode_equals_full_pass(d: &Decoder, fx: &Value, steps: usize) {
    let generations = fx["generations"].as_array().unwrap();
    let g = generations.last().unwrap();
    let m = &d.model;
    let mut seq = ids(&g["prompt_ids"]);
    let mut cache = m.new_cache().unwrap();
    m.forward_last(&seq, &mut cache).unwrap();
    for &next in ids(&g["ids"]).iter().take(steps) {
        seq.push(next);
        let step = m.forward(&[next], &mut cache).unwrap();
        assert_eq!(step.dims(), &[1, m.config().vocab_size]);
        let full = m.forward_last(&seq, &mut m.new_cache().unwrap()).unwrap();
        let last = full.get(0).unwrap();
        let diff = (step.get(0).unwrap() - last).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 2e-4, "decode step {} differs from the full pass by {diff}", seq.len());
    }
    assert_eq!(cache.len(), seq.len());
}

/// The perplexity of the fixture's text equals transformers' within 1e-4 relative.
fn assert_perplexity(d: &Decoder, fx: &Value) {
    let fx = &fx["perplexity"];
    let text = std::fs::read_to_string(format!("/usr/share/common-licenses/{}", fx["text"].as_str().unwrap())).unwrap();
    let n = fx["tokens"].as_u64().unwrap() as usize;
    let ids = d.tokenizer.encode(&text).unwrap();
    let nll = mean_nll(&d.model, &ids[..n]).unwrap();
    let want = fx["nll"].as_f64().unwrap();
    assert!(((nll - want) / want).abs() <= 1e-4, "mean NLL {nll}, transformers' float64 {want}");
}

#[test]
fn smollm2_token_ids_and_chat_prompt_equal_transformers() {
    assert_tokenizer(smollm2(), &fixture("smollm2.json"));
}

#[test]
fn smollm2_prefill_logits_pass_the_oracle_rule() {
    assert_prefill(smollm2(), &fixture("smollm2.json"), "SmolLM2");
}

#[test]
fn smollm2_greedy_continuations_equal_transformers() {
    assert_greedy(smollm2(), &fixture("smollm2.json"));
}

#[test]
fn smollm2_decode_equals_rerunning_the_sequence() {
    assert_decode_equals_full_pass(smollm2(), &fixture("smollm2.json"), 4);
}

#[test]
fn smollm2_perplexity_equals_transformers() {
    assert_perplexity(smollm2(), &fixture("smollm2.json"));
}

#[test]
fn gemma3_token_ids_equal_transformers() {
    assert_tokenizer(gemma3(), &fixture("gemma3.json"));
}

#[test]
fn gemma3_prefill_logits_pass_the_oracle_rule() {
    assert_prefill(gemma3(), &fixture("gemma3.json"), "Gemma 3");
}

#[test]
fn gemma3_greedy_continuations_equal_transformers_with_the_window_biting() {
    let fx = fixture("gemma3.json");
    let long = fx["generations"].as_array().unwrap().last().unwrap();
    assert!(ids(&long["prompt_ids"]).len() > 600, "the long prompt must pass the 512-key window");
    assert_greedy(gemma3(), &fx);
}

#[test]
fn gemma3_decode_past_the_window_equals_rerunning_the_sequence() {
    assert_decode_equals_full_pass(gemma3(), &fixture("gemma3.json"), 2);
}

#[test]
fn gemma3_perplexity_equals_transformers() {
    assert_perplexity(gemma3(), &fixture("gemma3.json"));
}

/// attn's head scores on the fixture's ids against transformers' from `output_attentions`.
fn assert_head_scores(model: &dyn AttentionWeights, fx: &Value, what: &str) {
    let (ours, _) = HeadScores::measure(model, &ids(&fx["text_ids"]), &ids(&fx["induction_ids"])).unwrap();
    let err32 = fx["err32"].as_f64().unwrap();
    for (kind, map) in [("sink", &ours.sink), ("previous", &ours.previous), ("induction", &ours.induction)] {
        let flat: Vec<f32> = map.iter().flatten().map(|&x| x as f32).collect();
        let want: Vec<f64> = fx[kind].as_array().unwrap().iter().flat_map(floats).collect();
        assert_oracle(&format!("{what} {kind} scores"), &flat, &want, err32, 1e-6);
    }
}

#[test]
fn head_scores_equal_those_from_transformers_attention_weights() {
    assert_head_scores(&minilm().bert, &fixture("minilm.json")["heads"], "MiniLM");
    assert_head_scores(&smollm2().model, &fixture("smollm2.json")["heads"], "SmolLM2");
}

/// The tiny random Llama, Qwen2 (biases) and Mistral (4-key window) models in Hugging Face's
/// layout: logits of 12 tokens under the oracle rule, then the decode path against them.
#[test]
fn llama_family_by_hugging_face_names_equals_transformers() {
    for name in ["llama", "qwen2", "mistral"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("tiny-{name}"));
        let fx = fixture(&format!("tiny-{name}/logits.json"));
        let m = attn_models::CausalLm::from_hf_dir(&dir).unwrap();
        let seq = ids(&fx["ids"]);
        let logits: Vec<f32> =
            m.forward(&seq, &mut m.new_cache().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<f64> = fx["logits"].as_array().unwrap().iter().flat_map(floats).collect();
        let err32 = fx["err32"].as_f64().unwrap();
        assert_oracle(&format!("tiny {name} logits"), &logits, &want, err32, 1e-6);
        let mut cache = m.new_cache().unwrap();
        let mut stepped = Vec::new();
        for &id in &seq {
            stepped.extend(m.forward(&[id], &mut cache).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap());
        }
        assert_oracle(&format!("tiny {name} logits decoded one by one"), &stepped, &want, err32, 1e-6);
    }
    // Without its tokenizer the directory is no decoder.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let e = Decoder::open(&dir).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("missing"), "{e}");
}

/// SmolLM2's two chat prompts (37 and 37+ tokens, different continuations) and the long prompt
/// decoded as one batch: each equals transformers' greedy continuation, and stops on its own.
#[test]
fn smollm2_prompts_decoded_as_one_batch_equal_transformers() {
    let fx = fixture("smollm2.json");
    let gens = fx["generations"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = gens.iter().map(|g| ids(&g["prompt_ids"])).collect();
    let n = 12;
    let stop = Stop { max_new_tokens: n, eos: None };
    let mut seen = vec![0; prompts.len()];
    let got = attn_models::greedy_batch(&smollm2().model, &prompts, stop, |b, _| {
        seen[b] += 1;
        Ok(())
    })
    .unwrap();
    for (g, out) in gens.iter().zip(&got) {
        assert_eq!(out.ids, ids(&g["ids"])[..n], "batched continuation `{}`", g["name"]);
    }
    assert_eq!(seen, vec![n; prompts.len()]);
    // With the stop token: the chat ends after `<|im_end|>` (its 8th id), the others go on.
    let stop = Stop { max_new_tokens: n, eos: Some(2) };
    let got = attn_models::greedy_batch(&smollm2().model, &prompts, stop, |_, _| Ok(())).unwrap();
    assert_eq!(got[0].ids, ids(&gens[0]["ids"])[..8]);
    assert_eq!(got[2].ids.len(), n);
}

/// A decoder of its own (the shared ones keep the dense cache) with its caches paged.
fn paged_decoder(name: &str) -> Decoder {
    let mut d = Decoder::open(&model_path(name)).unwrap();
    d.model.set_kv_dtype(Some(KvDtype::F32));
    d
}

/// Through an f32 paged cache (the paged kernel for prefill and decode) SmolLM2 passes what it
/// passes through the dense one; through int8 and fp8 caches its perplexity on 1024 tokens stays
/// within 0.5% and 2% of the f32 cache's (the accuracy targets).
#[test]
fn smollm2_through_paged_caches() {
    let fx = fixture("smollm2.json");
    let mut d = paged_decoder("smollm2");
    assert_prefill(&d, &fx, "SmolLM2 (paged f32 cache)");
    assert_greedy(&d, &fx);
    assert_decode_equals_full_pass(&d, &fx, 3);
    assert_perplexity(&d, &fx);
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let ids = d.tokenizer.encode(&text).unwrap();
    let ppl = |d: &Decoder| mean_nll(&d.model, &ids[..1024]).unwrap().exp();
    let f32_cache = ppl(&d);
    for (dtype, within) in [(KvDtype::Int8, 0.005), (KvDtype::Fp8, 0.02)] {
        d.model.set_kv_dtype(Some(dtype));
        let p = ppl(&d);
        eprintln!("SmolLM2, 1024 tokens: perplexity {p} with the {dtype} cache, {f32_cache} with f32");
        assert!((p / f32_cache - 1.0).abs() <= within, "{dtype} cache: perplexity {p}, f32 cache {f32_cache}");
    }
}

/// Gemma 3 through an f32 paged cache: its sliding window (bottom-right, across pages) bites in
/// the long greedy continuation and in decode steps past it.
#[test]
fn gemma3_through_a_paged_cache_with_the_window_biting() {
    let fx = fixture("gemma3.json");
    let d = paged_decoder("gemma3");
    assert_greedy(&d, &fx);
    assert_decode_equals_full_pass(&d, &fx, 2);
}

/// With bf16 products, the weights stored as bfloat16 or as 8-bit blocks, MiniLM's embeddings
/// stay within cosine 0.999 of the float64 model's (each a unit vector; bfloat16 keeps 8 bits of
/// each weight and layer input).
#[test]
fn minilm_with_bf16_and_int8_weights_embeds_close_to_the_float64_model() {
    let fx = fixture("minilm.json");
    let texts: Vec<&str> = fx["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    for weights in [Weights::Bf16, Weights::Int8] {
        let enc = SentenceEncoder::load_with(&model_path("minilm"), weights).unwrap();
        let ours: Vec<Vec<f32>> = enc.embed(&texts).unwrap().to_vec2().unwrap();
        for (i, (e, want)) in ours.iter().zip(fx["embeddings"].as_array().unwrap()).enumerate() {
            let cos: f64 = e.iter().zip(floats(want)).map(|(&a, b)| a as f64 * b).sum();
            eprintln!("MiniLM {weights}, text {i}: cosine {cos} with the float64 embedding");
            assert!(cos >= 0.999, "{weights} text {i}: cosine {cos} with the float64 embedding");
        }
    }
}

/// With bf16 products `model`'s perplexity on its fixture's text stays within `bounds` (relative)
/// of the float64 model's for each weight storage, and switching back to f32 products restores
/// the parity mode.
fn assert_weights_keep_the_perplexity(model: &str, bounds: [(Weights, f64); 2]) {
    let fx = fixture(&format!("{model}.json"));
    let mut d = Decoder::open_with(&model_path(model), bounds[0].0).unwrap();
    let p = &fx["perplexity"];
    let text = std::fs::read_to_string(format!("/usr/share/common-licenses/{}", p["text"].as_str().unwrap())).unwrap();
    let ids = d.tokenizer.encode(&text).unwrap();
    let n = p["tokens"].as_u64().unwrap() as usize;
    let want = p["nll"].as_f64().unwrap();
    for (weights, bound) in bounds {
        d.model.set_weights(weights).unwrap();
        let nll = mean_nll(&d.model, &ids[..n]).unwrap();
        eprintln!("{model} {weights} weights: perplexity {} against the float64 model's {}", nll.exp(), want.exp());
        assert!((nll.exp() / want.exp() - 1.0).abs() <= bound, "{model} {weights}: mean NLL {nll}, float64 {want}");
    }
    d.model.set_weights(Weights::F32).unwrap();
    assert_perplexity(&d, &fx);
}

/// SmolLM2: within 0.1% with 8-bit weights, which hold its Q4_1 blocks exactly (only the inputs'
/// rounding remains), and 1% with bfloat16 weights.
#[test]
fn smollm2_with_bf16_and_int8_weights_keeps_its_perplexity() {
    assert_weights_keep_the_perplexity("smollm2", [(Weights::Int8, 0.001), (Weights::Bf16, 0.01)]);
}

/// Gemma 3: within 1% either way — its Q4_K blocks are held exactly by 8-bit weights, its Q6_K,
/// Q5_0 and Q8_0 tensors re-quantized (+0.5% measured at 256 tokens).
#[test]
fn gemma3_with_bf16_and_int8_weights_keeps_its_perplexity() {
    assert_weights_keep_the_perplexity("gemma3", [(Weights::Int8, 0.01), (Weights::Bf16, 0.01)]);
}
