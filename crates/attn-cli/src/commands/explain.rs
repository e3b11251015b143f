//! `attn explain`: the seed texts' experiments, each printing a table and drawing its plots in a
//! folder. One submodule per experiment.

mod additive_vs_dot;
mod classify;
mod heads;
mod model;
mod scaling;
mod sparse;
mod variants;

/// Arguments of `attn explain`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub experiment: Experiment,
}

/// The experiments.
#[derive(clap::Subcommand, Debug)]
pub enum Experiment {
    /// Why q·k is scaled by 1/√d_k: score variance, softmax entropy and gradient over d_k.
    Scaling(scaling::Args),
    /// Time and memory of additive (Bahdanau) and scaled dot-product attention over lengths.
    AdditiveVsDot(additive_vs_dot::Args),
    /// What each head of a trained translator attends to: distance and entropy per head, heatmaps.
    Heads(heads::Args),
    /// Train a one-head self-attention classifier with padding masks; accuracy and its attention.
    Classify(classify::Args),
    /// Block-sparse patterns: each mask drawn, and time and memory over lengths (log-log slopes).
    Sparse(sparse::Args),
    /// Time and memory of the variants (dense, flash, window, sparse, linear, FAVOR+) over L,
    /// log-log slopes, and FAVOR+'s error against softmax as its features grow.
    Variants(variants::Args),
    /// What a real pretrained model's heads do: every layer's attention on a text as heatmaps, and
    /// sink, previous-token and induction scores per head.
    Model(model::Args),
}

/// Runs the chosen experiment.
pub fn main(args: Args) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::Scaling(a) => scaling::main(a),
        Experiment::AdditiveVsDot(a) => additive_vs_dot::main(a),
        Experiment::Heads(a) => heads::main(a),
        Experiment::Classify(a) => classify::main(a),
        Experiment::Sparse(a) => sparse::main(a),
        Experiment::Variants(a) => variants::main(a),
        Experiment::Model(a) => model::main(a),
    }
}
