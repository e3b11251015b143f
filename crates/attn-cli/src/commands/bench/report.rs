//! What `attn bench` prints: the measured FMA peak, the table's header and rows, and the JSON
//! object per shape (`--json`), from one [`Row`] per shape.

use attn::alloc::human_bytes;
use attn_kernels::Dims;
use serde_json::json;

use super::peak::Peak;
use super::sparse::Sparse;
use super::{packed, spec, Args};
use crate::commands::sdpa_flags::{align_name, precision_name};
use crate::measure::Measurement;

/// The result of one shape.
pub(super) struct Row {
    pub(super) dims: Dims,
    pub(super) flops: u64,
    pub(super) m: Measurement,
    /// The 64×64 blocks computed ([`spec::blocks`]).
    pub(super) blocks: spec::Blocks,
    /// With `--pattern`, its block mask.
    pub(super) sparse: Option<Sparse>,
}

impl Row {
    pub(super) fn gflops(&self) -> f64 {
        self.flops as f64 / self.m.median() / 1e9
    }
}

pub(super) fn print_peak(args: &Args, peak: Option<Peak>, threads: usize) {
    if args.json {
        let v = match peak {
            Some(p) => json!({"peak_isa": p.isa, "peak_single_gflops": p.single_gflops,
                              "peak_all_gflops": p.all_gflops, "threads": p.threads}),
            None => json!({"peak_isa": "unknown", "peak_single_gflops": null,
                           "peak_all_gflops": null, "threads": threads}),
        };
        println!("{v}");
    } else {
        match peak {
            Some(p) => println!(
                "FMA peak ({}, {}): {:.1} GFLOP/s on 1 thread, {:.1} GFLOP/s on {} thread(s)",
                p.isa,
                if p.isa == "avx512-bf16" { "bf16 products" } else { "f32" },
                p.single_gflops,
                p.all_gflops,
                p.threads
            ),
            None => println!("FMA peak: unknown (no AVX-512F or AVX2+FMA on this CPU)"),
        }
    }
}

/// The FLOP rule of `--backward`, in the line above the table's header.
pub(super) const BACKWARD_FLOPS: &str =
    "FLOPs = 3.5 x forward (backward counted as 2.5 x forward, FlashAttention's convention)";

/// The pattern's columns of the table: the fractions of blocks computed and of those partial, the
/// mask's building time and bytes, and the pattern with its parameters.
const PATTERN_HEADER: &str = "  blocks partial  build ms       mask  pattern";

pub(super) fn header(with_peak: bool, with_pattern: bool) -> String {
    format!(
        "{:<16} {:>7} {:>4} {:>4} {:<14} {:>7} {:>4} {:<21} {:>3} {:>11} {:>11} {:>11} {:>9}{} {:>10} {:>5}{}",
        "shape B,H,Lq,D",
        "Lk",
        "Hkv",
        "Dv",
        "band",
        "softcap",
        "kv",
        "kernel",
        "thr",
        "median ms",
        "min ms",
        "max ms",
        "GFLOP/s",
        if with_peak { format!(" {:>6}", "%peak") } else { String::new() },
        "extra",
        "iters",
        if with_pattern { PATTERN_HEADER } else { "" }
    )
}

/// The calls a row of shape `d` runs as ([`SdpaFlags::products`](crate::commands::sdpa_flags::SdpaFlags::products)):
/// each packed sequence its own with `--seq-lens` (unless `--padded`), else the shape's one.
fn calls(args: &Args, d: &Dims) -> Vec<Dims> {
    match args.seq_lens.as_ref().filter(|_| !args.padded) {
        Some(lens) => packed::calls(d, lens),
        None => vec![*d],
    }
}

pub(super) fn table_row(args: &Args, threads: usize, row: &Row, peak_all: Option<f64>) -> String {
    let d = row.dims;
    let gflops = row.gflops();
    format!(
        "{:<16} {:>7} {:>4} {:>4} {:<14} {:>7} {:>4} {:<21} {:>3} {:>11.4} {:>11.4} {:>11.4} {:>9.2}{} {:>10} {:>5}{}",
        spec::shape_text(&d),
        d.lk,
        d.hkv,
        d.dv,
        args.sdpa.band_text(),
        args.sdpa.softcap.map_or("-".to_string(), |c| c.to_string()),
        args.kv_dtype.as_str(),
        args.sdpa.kernel_text(&calls(args, &d)),
        threads,
        row.m.median() * 1e3,
        row.m.min() * 1e3,
        row.m.max() * 1e3,
        gflops,
        peak_all.map_or(String::new(), |p| format!(" {:>6.1}", 100.0 * gflops / p)),
        human_bytes(row.m.extra_bytes as f64, true),
        row.m.times.len(),
        row.sparse.as_ref().map_or(String::new(), |s| format!(
            "  {:>6.4} {:>7.4} {:>9.3} {:>10}  {}",
            row.blocks.computed,
            row.blocks.partial,
            s.build.median() * 1e3,
            human_bytes(s.mask.bytes() as f64, true),
            s.pattern
        ))
    )
}

pub(super) fn json_row(args: &Args, threads: usize, row: &Row, peak_all: Option<f64>) -> serde_json::Value {
    let d = row.dims;
    let products = args.sdpa.products(&calls(args, &d));
    let mut v = json!({
        "shape": spec::shape_text(&d),
        "kv_len": d.lk,
        "kv_heads": d.hkv,
        "dv": d.dv,
        "kernel": args.sdpa.kernel.name(),
        "kernel_resolved": args.sdpa.kernel.resolve().map(|k| k.name()).ok(),
        "threads": threads,
        "kv_dtype": args.kv_dtype.as_str(),
        "compute": precision_name(products.precision()),
        "decode_f32_calls": products.decoding,
        "amx_calls": products.on_amx,
        "causal": args.sdpa.causal,
        "align": align_name(args.sdpa.align),
        "window": args.sdpa.options().window.map(|w| [w.left, w.right]),
        "scale": args.sdpa.scale,
        "softcap": args.sdpa.softcap,
        "dropout": args.sdpa.dropout,
        "seed": args.sdpa.options().dropout.map(|d| d.seed),
        "backward": args.backward,
        "autograd": args.autograd,
        "seq_lens": args.seq_lens,
        "padded": args.padded,
        "median_s": row.m.median(),
        "min_s": row.m.min(),
        "max_s": row.m.max(),
        "flops": row.flops,
        "gflops": row.gflops(),
        "extra_bytes": row.m.extra_bytes,
        "iters": row.m.times.len(),
        "blocks": row.blocks.computed,
        "partial_blocks": row.blocks.partial,
        "pattern": row.sparse.as_ref().map(|s| s.pattern.to_string()),
        "density": row.sparse.as_ref().map(|s| s.mask.density()),
        "mask_build_s": row.sparse.as_ref().map(|s| s.build.median()),
        "mask_bytes": row.sparse.as_ref().map(|s| s.mask.bytes()),
    });
    if let Some(p) = peak_all {
        v["pct_of_peak"] = json!(100.0 * row.gflops() / p);
    }
    v
}
