//! The `attn` command's pieces as a library (so tests and fuzz targets can reach them): the
//! validated file readers and writers in [`io`], and one module per subcommand in [`commands`].

pub mod alloc_meter;
pub mod commands;
pub mod io;
