//! `attn embed`: sentence embeddings of texts with a BERT sentence encoder (MiniLM): mean pooling
//! over the real tokens, L2-normalised; the texts go as one padded batch. Prints the cosine
//! similarities of the inputs, or with `--json` the embeddings themselves; the time taken on
//! stderr.

use std::path::PathBuf;

use anyhow::Context;

use super::models::{ModelArg, WeightsArg};
use super::threads::Threads;

/// Arguments of `attn embed`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    /// The texts to embed.
    #[arg(required_unless_present = "input", conflicts_with = "input")]
    pub texts: Vec<String>,
    /// A file with one text per line (blank lines skipped) instead of TEXT arguments.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Print `{"dim": E, "embeddings": [[...], ...]}` (in input order) instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub weights: WeightsArg,
    #[command(flatten)]
    pub threads: Threads,
}

/// Runs `attn embed`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let texts = match &args.input {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let lines: Vec<String> = text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
            anyhow::ensure!(!lines.is_empty(), "{}: no text in the file", path.display());
            lines
        }
        None => args.texts.clone(),
    };
    let dir = args.model.path()?;
    let encoder = attn_models::SentenceEncoder::load_with(&dir, args.weights.weights)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let start = std::time::Instant::now();
    let embeddings: Vec<Vec<f32>> = args.threads.pool()?.install(|| encoder.embed(&refs))?.to_vec2()?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} texts in {:.1} ms ({:.1} texts/s, {} threads)",
        texts.len(),
        secs * 1e3,
        texts.len() as f64 / secs,
        args.threads.get()
    );
    if args.json {
        let dim = embeddings.first().map_or(0, Vec::len);
        println!("{}", serde_json::json!({ "dim": dim, "embeddings": embeddings }));
        return Ok(());
    }
    print_similarities(&texts, &embeddings);
    Ok(())
}

/// The cosine similarity of every pair (the embeddings are unit vectors, so their dot products).
fn print_similarities(texts: &[String], e: &[Vec<f32>]) {
    println!("cosine similarity of {} texts ({} dimensions):", texts.len(), e.first().map_or(0, Vec::len));
    for (i, t) in texts.iter().enumerate() {
        println!("  [{i}] {t}");
    }
    print!("     ");
    for j in 0..texts.len() {
        print!("{:>7}", format!("[{j}]"));
    }
    println!();
    for (i, a) in e.iter().enumerate() {
        print!("{:>5}", format!("[{i}]"));
        for b in e {
            let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            print!("{dot:>7.3}");
        }
        println!();
    }
}
