//! One module per subcommand, each with its clap `Args` and a `main`, and the flags several share:
//! the attention flags of `run` and `bench`, `--threads` and `--out-dir`.

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
