//! Every suite of attn-cli's tests in one test binary (one build and link instead of one per
//! file): each `tests/<suite>.rs` is a module here, loaded by path so that its own helper
//! folders resolve beside it; the helper folders several suites share are declared once.

#[path = "cli_bench.rs"]
mod cli_bench;
#[path = "cli_bench_pattern.rs"]
mod cli_bench_pattern;
#[path = "cli_demo.rs"]
mod cli_demo;
#[path = "cli_error_lines.rs"]
mod cli_error_lines;
#[path = "cli_errors.rs"]
mod cli_errors;
#[path = "cli_explain.rs"]
mod cli_explain;
#[path = "cli_explain_variants.rs"]
mod cli_explain_variants;
#[path = "cli_flags.rs"]
mod cli_flags;
#[path = "cli_formats.rs"]
mod cli_formats;
#[path = "cli_heatmap.rs"]
mod cli_heatmap;
#[path = "cli_memory.rs"]
mod cli_memory;
#[path = "cli_models.rs"]
mod cli_models;
#[path = "cli_output_files.rs"]
mod cli_output_files;
#[path = "cli_run.rs"]
mod cli_run;
#[path = "cli_run_delta.rs"]
mod cli_run_delta;
#[path = "cli_run_errors.rs"]
mod cli_run_errors;
#[path = "cli_run_grads.rs"]
mod cli_run_grads;
#[path = "cli_run_linear.rs"]
mod cli_run_linear;
#[path = "cli_run_packed.rs"]
mod cli_run_packed;
#[path = "cli_run_pattern.rs"]
mod cli_run_pattern;
#[path = "cli_train.rs"]
mod cli_train;
#[path = "cli_train_guards.rs"]
mod cli_train_guards;
#[path = "cli_train_help.rs"]
mod cli_train_help;
#[path = "cli_translate_lines.rs"]
mod cli_translate_lines;
mod common;
#[path = "io_npy.rs"]
mod io_npy;
#[path = "io_npz.rs"]
mod io_npz;
#[path = "io_safetensors.rs"]
mod io_safetensors;
mod train_common;
