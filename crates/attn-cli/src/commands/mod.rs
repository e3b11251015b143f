//! One module per subcommand, each with its clap `Args` and a `main`, and the attention flags that
//! `run` and `bench` share.

pub mod bench;
pub mod demo;
pub mod explain;
pub mod heatmap;
pub mod out_dir;
pub mod run;
pub mod sdpa_flags;
pub mod train;
pub mod translate;
