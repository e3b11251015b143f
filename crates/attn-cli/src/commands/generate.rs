//! `attn generate`: greedy decoding of a prompt with a decoder (SmolLM2, Gemma 3) and its KV cache,
//! streamed to stdout as it comes, tokens per second on stderr; `--json` prints one object
//! instead. Several prompts are decoded as one batch (each its own prefill, then one batched step
//! per token) and printed when done, one JSON object a line with `--json`.

use std::io::Write;

use attn_models::{Decoder, Stop};

use super::models::{KvDtypeArg, ModelArg, WeightsArg};
use super::threads::Threads;

/// Arguments of `attn generate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    /// The prompt; several are decoded as one batch.
    #[arg(required = true)]
    pub prompts: Vec<String>,
    /// Send the prompt as a chat's user message through the model's chat template (instruct
    /// models; with the template's default system prompt).
    #[arg(long)]
    pub chat: bool,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_new_tokens: usize,
    /// Keep generating past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print `{"prompt_ids": [...], "ids": [...], "text": "...", "prefill_tokens_per_s": x,
    /// "decode_tokens_per_s": y}` instead of streaming.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: KvDtypeArg,
    #[command(flatten)]
    pub weights: WeightsArg,
    #[command(flatten)]
    pub threads: Threads,
}

/// Runs `attn generate`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    let mut decoder = Decoder::open_with(&path, args.weights.weights)?;
    decoder.model.set_kv_dtype(args.kv.kv_dtype);
    let prompts = args.prompts.iter().map(|p| decoder.prompt(p, args.chat)).collect::<attn_models::Result<Vec<_>>>()?;
    let stop =
        Stop { max_new_tokens: args.max_new_tokens, eos: if args.ignore_eos { None } else { decoder.tokenizer.eos } };
    let pool = args.threads.pool()?;
    if prompts.len() > 1 {
        let generations = pool.install(|| attn_models::greedy_batch(&decoder.model, &prompts, stop, |_, _| Ok(())))?;
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
        let decoded: usize = generations.iter().map(|g| g.ids.len().saturating_sub(1)).sum();
        let (prefill, decode) = rates(prompt_tokens, decoded, &generations[0]);
        for (i, (prompt, g)) in prompts.iter().zip(&generations).enumerate() {
            let text = text_of(&decoder, &g.ids, stop)?;
            if args.json {
                println!("{}", report(prompt, &g.ids, &text, prefill, decode));
            } else {
                println!("[{i}] {text}");
            }
        }
        if !args.json {
            eprintln!(
                "{} prompts as one batch: prefill {prompt_tokens} tokens, {prefill:.1} tokens/s; decode {decoded} tokens, \
                 {decode:.1} tokens/s ({} threads)",
                prompts.len(),
                args.threads.get()
            );
        }
        return Ok(());
    }
    let prompt = &prompts[0];
    let mut ids = Vec::new();
    let mut shown = 0;
    let generation = pool.install(|| {
        attn_models::greedy(&decoder.model, prompt, stop, |id| {
            ids.push(id);
            if !args.json && Some(id) != stop.eos {
                // The text so far, decoded whole: a character split over tokens appears once complete.
                let text = decoder.tokenizer.decode(&ids)?;
                if text.len() > shown && text.is_char_boundary(shown) && !text.ends_with('\u{fffd}') {
                    print!("{}", &text[shown..]);
                    let _ = std::io::stdout().flush();
                    shown = text.len();
                }
            }
            Ok(())
        })
    })?;
    let decoded = generation.ids.len().saturating_sub(1);
    let (prefill_rate, decode_rate) = rates(prompt.len(), decoded, &generation);
    let text = text_of(&decoder, &generation.ids, stop)?;
    if args.json {
        println!("{}", report(prompt, &generation.ids, &text, prefill_rate, decode_rate));
    } else {
        if text.len() > shown {
            print!("{}", &text[shown.min(text.len())..]);
        }
        println!();
        eprintln!(
            "prefill: {} tokens, {prefill_rate:.1} tokens/s; decode: {decoded} tokens, {decode_rate:.1} tokens/s ({} threads)",
            prompt.len(),
            args.threads.get()
        );
    }
    Ok(())
}

/// Prefill and decode tokens per second of `g`'s times.
fn rates(prompt_tokens: usize, decoded: usize, g: &attn_models::Generation) -> (f64, f64) {
    let decode = if g.decode_secs > 0.0 { decoded as f64 / g.decode_secs } else { 0.0 };
    (prompt_tokens as f64 / g.prefill_secs, decode)
}

/// The text of the new ids, without the stop token that ended them.
fn text_of(decoder: &Decoder, ids: &[u32], stop: Stop) -> anyhow::Result<String> {
    let body = match stop.eos {
        Some(eos) => ids.strip_suffix(&[eos]).unwrap_or(ids),
        None => ids,
    };
    Ok(decoder.tokenizer.decode(body)?)
}

/// The JSON contract of one generation.
fn report(prompt: &[u32], ids: &[u32], text: &str, prefill: f64, decode: f64) -> serde_json::Value {
    serde_json::json!({
        "prompt_ids": prompt,
        "ids": ids,
        "text": text,
        "prefill_tokens_per_s": prefill,
        "decode_tokens_per_s": decode,
    })
}
