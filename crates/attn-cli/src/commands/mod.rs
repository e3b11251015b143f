//! One module per subcommand, each with its clap `Args` and a `main`.

pub mod bench;
pub mod demo;
pub mod heatmap;
pub mod run;
