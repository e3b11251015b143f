//! `attn perplexity`: the mean negative log-likelihood and perplexity of a text file's first
//! tokens under a decoder, in one causal pass.

use std::path::PathBuf;

use anyhow::Context;
use attn_models::Decoder;

use super::models::{KvDtypeArg, ModelArg, WeightsArg};
use super::threads::Threads;

/// Arguments of `attn perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    /// The text file.
    #[arg(long, value_name = "FILE")]
    pub text: PathBuf,
    /// How many of its first tokens to score (at least 2; fewer if the text is shorter).
    #[arg(long, default_value_t = 512, value_name = "N", value_parser = clap::value_parser!(u64).range(2..))]
    pub context: u64,
    /// Print `{"tokens": n, "nll": x, "ppl": y}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: KvDtypeArg,
    #[command(flatten)]
    pub weights: WeightsArg,
    #[command(flatten)]
    pub threads: Threads,
}

/// Runs `attn perplexity`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.text).with_context(|| format!("reading {}", args.text.display()))?;
    let mut decoder = Decoder::open_with(&args.model.path()?, args.weights.weights)?;
    decoder.model.set_kv_dtype(args.kv.kv_dtype);
    let mut ids = decoder.tokenizer.encode(&text)?;
    ids.truncate(args.context as usize);
    let nll = args.threads.pool()?.install(|| attn_models::mean_nll(&decoder.model, &ids))?;
    let ppl = nll.exp();
    if args.json {
        let kv = args.kv.kv_dtype.map(|d| d.name());
        println!(
            "{}",
            serde_json::json!({ "tokens": ids.len(), "nll": nll, "ppl": ppl, "kv_dtype": kv,
            "weights": args.weights.weights.to_string() })
        );
    } else {
        println!("{}: {} tokens, mean NLL {nll:.4} nats, perplexity {ppl:.3}", args.text.display(), ids.len());
    }
    Ok(())
}
