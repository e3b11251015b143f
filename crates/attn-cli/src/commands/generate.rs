//! `attn generate`: greedy decoding of a prompt with a decoder (SmolLM2, Gemma 3) and its KV cache,
//! streamed to stdout as it comes, tokens per second on stderr; `--json` prints one object
//! instead.

use std::io::Write;

use attn_models::{Decoder, Stop};

use super::models::ModelArg;
use super::threads::Threads;

/// Arguments of `attn generate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    /// The prompt.
    pub prompt: String,
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
    pub threads: Threads,
}

/// Runs `attn generate`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    let decoder = Decoder::open(&path)?;
    let prompt = decoder.prompt(&args.prompt, args.chat)?;
    let stop =
        Stop { max_new_tokens: args.max_new_tokens, eos: if args.ignore_eos { None } else { decoder.tokenizer.eos } };
    let mut ids = Vec::new();
    let mut shown = 0;
    let generation = args.threads.pool()?.install(|| {
        attn_models::greedy(&decoder.model, &prompt, stop, |id| {
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
    let prefill_rate = prompt.len() as f64 / generation.prefill_secs;
    let decoded = generation.ids.len().saturating_sub(1);
    let decode_rate = if generation.decode_secs > 0.0 { decoded as f64 / generation.decode_secs } else { 0.0 };
    let text = decoder
        .tokenizer
        .decode(generation.ids.strip_suffix(&[stop.eos.unwrap_or(u32::MAX)]).unwrap_or(&generation.ids))?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "prompt_ids": prompt,
                "ids": generation.ids,
                "text": text,
                "prefill_tokens_per_s": prefill_rate,
                "decode_tokens_per_s": decode_rate,
            })
        );
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
