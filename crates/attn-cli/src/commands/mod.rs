//! One module per subcommand, each with its clap `Args` and a `main`, and what several share: the
//! attention flags of `run` and `bench`, `--threads`, `--out-dir`, naming a library setting by its
//! flag, the stop by Ctrl-C, and printing above a progress bar.

pub mod bench;
pub mod demo;
pub mod embed;
pub mod explain;
pub mod generate;
pub mod heatmap;
pub mod models;
pub mod out_dir;
pub mod pattern_flags;
pub mod perplexity;
pub mod run;
pub mod sdpa_flags;
pub mod threads;
pub mod train;
pub mod translate;

use attn_train::TrainError;

/// Prints `line` above the progress bar `bar`, or on standard output when there is no terminal to
/// draw it on (indicatif drops a hidden bar's lines).
pub fn say(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        println!("{line}");
    } else {
        bar.println(line);
    }
}

/// A command stopped by Ctrl-C after saving its work and saying so: `attn` exits with 130.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// `e` as the user of the flags `A` sees it: a refused setting whose field is one of `A`'s flags
/// is named by the flag (`held_out` → `--held-out`); any other error is passed on.
pub fn with_flag<A: clap::Args>(e: TrainError) -> anyhow::Error {
    if let TrainError::Setting { field, reason } = &e {
        if let Some(long) = flag_of::<A>(field) {
            return anyhow::anyhow!("--{long}: {reason}");
        }
    }
    e.into()
}

/// The long flag (without `--`) of `A`'s argument whose id is `field`, if there is one.
pub fn flag_of<A: clap::Args>(field: &str) -> Option<String> {
    let command = A::augment_args(clap::Command::new("attn"));
    let long = command.get_arguments().find(|a| a.get_id() == field).and_then(|a| a.get_long());
    long.map(str::to_string)
}
