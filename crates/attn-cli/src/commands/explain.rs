//! `attn explain`: the seed texts' experiments, each printing a table and drawing its plots in a
//! folder. One submodule per experiment.

mod additive_vs_dot;

/// Arguments of `attn explain`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub experiment: Experiment,
}

/// The experiments.
#[derive(clap::Subcommand, Debug)]
pub enum Experiment {
    /// Time and memory of additive (Bahdanau) and scaled dot-product attention over lengths.
    AdditiveVsDot(additive_vs_dot::Args),
}

/// Runs the chosen experiment.
pub fn main(args: Args) -> anyhow::Result<()> {
    match args.experiment {
        Experiment::AdditiveVsDot(a) => additive_vs_dot::main(a),
    }
}
