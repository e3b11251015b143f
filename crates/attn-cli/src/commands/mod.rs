//! One module per subcommand, each with its clap `Args` and a `main`, and what several share: the
//! attention flags of `run` and `bench`, `--threads`, `--out-dir`, naming a library setting by its
//! flag, and the stop by Ctrl-C.

pub mod bench;
pub mod demo;
pub mod explain;
pub mod heatmap;
pub mod out_dir;
pub mod run;
pub mod sdpa_flags;
pub mod threads;
pub mod train;
pub mod translate;

use attn_train::TrainError;

/// A command stopped by Ctrl-C after saving its work and saying so: `attn` exits with 130.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// `e` as the user of the flags `A` sees it: a refused setting whose field is one of `A`'s flags
/// is named by the flag (`held_out` → `--held-out`); any other error is passed on.
pub fn with_flag<A: clap::Args>(e: TrainError) -> anyhow::Error {
    if let TrainError::Setting { field, reason } = &e {
        let command = A::augment_args(clap::Command::new("attn"));
        let long = command.get_arguments().find(|a| a.get_id() == *field).and_then(|a| a.get_long());
        if let Some(long) = long {
            return anyhow::anyhow!("--{long}: {reason}");
        }
    }
    e.into()
}
