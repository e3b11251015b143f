//! The `attn` command: parses the command line and hands each subcommand to its module under
//! `commands/`. Every error, usage errors included, is printed as one line on stderr with exit
//! code 1, never a panic, whatever the environment (a backtrace candle appends when
//! `RUST_BACKTRACE` is set is cut off, and a cause already said is not repeated); a command
//! stopped by Ctrl-C after saving exits 130; `--help` and `--version` print clap's text and exit
//! 0. At start `attn_nn::process::setup` quiets candle's element-wise pool and keeps freed
//! buffers in the heap.

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, Subcommand};

use attn_cli::commands;

/// Scaled dot-product attention from the command line.
#[derive(Parser)]
#[command(name = "attn", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run attention on tensors stored in a safetensors or .npz file (or .npy files).
    Run(Box<commands::run::Args>),
    /// Walk through worked examples on built-in data and draw a heatmap.
    Demo(commands::demo::Args),
    /// Draw attention weights as a heatmap (PNG, SVG or JPEG by extension).
    Heatmap(commands::heatmap::Args),
    /// Benchmark a kernel on a shape and report time, GFLOP/s and memory.
    Bench(Box<commands::bench::Args>),
    /// Run the textbook experiments: tables and plots.
    Explain(commands::explain::Args),
    /// Train a Transformer translator (built-in dates task or your own pairs).
    #[command(after_help = commands::train::dates_forms_help())]
    Train(Box<commands::train::Args>),
    /// Translate texts with a trained checkpoint and draw its attention.
    Translate(commands::translate::Args),
    /// The real pretrained models: list them, fetch them into the cache.
    Models(commands::models::Args),
    /// Sentence embeddings of texts with a real encoder (MiniLM) and their cosine similarities.
    Embed(commands::embed::Args),
    /// Greedy text generation with a real decoder (SmolLM2, Gemma 3) and its KV cache, streamed.
    Generate(commands::generate::Args),
    /// Perplexity of a text file under a real decoder.
    Perplexity(commands::perplexity::Args),
}

fn main() {
    attn_nn::process::setup();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                eprintln!("error: {} (see '{}')", usage_message(&e), help_command());
                std::process::exit(1);
            }
        },
    };
    let result = match cli.command {
        Command::Run(a) => commands::run::main(*a),
        Command::Demo(a) => commands::demo::main(a),
        Command::Heatmap(a) => commands::heatmap::main(a),
        Command::Bench(a) => commands::bench::main(*a),
        Command::Explain(a) => commands::explain::main(a),
        Command::Train(a) => commands::train::main(*a),
        Command::Translate(a) => commands::translate::main(a),
        Command::Models(a) => commands::models::main(a),
        Command::Embed(a) => commands::embed::main(a),
        Command::Generate(a) => commands::generate::main(a),
        Command::Perplexity(a) => commands::perplexity::main(a),
    };
    if let Err(e) = result {
        if e.is::<commands::Interrupted>() {
            std::process::exit(130);
        }
        eprintln!("error: {}", message(&e));
        std::process::exit(1);
    }
}

/// `e` and its causes as one line, joined by `: `: each cause on one line
/// ([`attn_train::error::one_line`]), and a cause whose text the line already holds (an operating
/// system's reason a file error has said) left out.
fn message(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = attn_train::error::one_line(&cause.to_string());
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// The first paragraph of clap's message as one line, without clap's `error: ` prefix: the first
/// line can end in a colon with a list (such as the missing arguments) on the next lines, which
/// are appended comma-separated.
fn usage_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let mut lines = text.lines().map(str::trim).take_while(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    let list: Vec<&str> = lines.collect();
    if list.is_empty() {
        first.to_string()
    } else {
        format!("{first} {}", list.join(", "))
    }
}

/// `attn <subcommand> --help` for the first subcommand named on the command line, else `attn --help`.
fn help_command() -> String {
    let cli = Cli::command();
    let named = std::env::args().skip(1).find(|a| cli.find_subcommand(a).is_some());
    match named {
        Some(sub) => format!("attn {sub} --help"),
        None => "attn --help".to_string(),
    }
}
