//! The `attn` command: parses the command line and hands each subcommand to its module under
//! `commands/`. Every error is printed as one line on stderr with a non-zero exit, never a panic.

use clap::{Parser, Subcommand};

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
    /// Run attention on tensors stored in a safetensors file (or .npy files).
    Run(commands::run::Args),
    /// Walk through worked examples on built-in data and draw a heatmap.
    Demo(commands::demo::Args),
    /// Draw attention weights as a heatmap (PNG, or SVG by file name).
    Heatmap(commands::heatmap::Args),
    /// Benchmark a kernel on a shape and report time, GFLOP/s and memory.
    Bench(commands::bench::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => commands::run::main(a),
        Command::Demo(a) => commands::demo::main(a),
        Command::Heatmap(a) => commands::heatmap::main(a),
        Command::Bench(a) => commands::bench::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
