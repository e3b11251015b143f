//! The `attn` command's pieces as a library (so tests and fuzz targets can reach them): the
//! validated file readers and writers in [`io`], the timing loop of benchmarks and experiments in
//! [`measure`], and one module per subcommand in [`commands`].

pub mod alloc_meter;
pub mod commands;
pub mod io;
pub mod measure;
