//! `attn bench`: times `attn::sdpa_full` under the shared attention flags on seeded random inputs
//! of one or more shapes in a rayon pool of a chosen size, and reports the median/min/max time per
//! call, GFLOP/s (see [`spec::FLOP_RULE`]) and the memory a call allocates beyond its output;
//! `--backward` times forward plus backward instead (see the `backward` submodule), `--peak` adds the
//! machine's FMA peak, `--seq-lens` times packed variable-length sequences or, with `--padded`,
//! their padded batch (see the `packed` submodule), `--pattern` a named block-sparse pattern, its
//! mask built once per shape before timing, reported with the fraction of blocks computed, its
//! building time and its bytes (see the `sparse` submodule), and with `--vs-full` against the
//! full call in alternating rounds (see the `vs_full` submodule). Output is a table, or one JSON
//! object per line with `--json`. The library's own work around the kernel (checks, views, wrapping the results in
//! tensors) costs microseconds and allocates no copy of the inputs or outputs. While a shape is
//! timed, a spinner on stderr (hidden when stderr is not a terminal) counts its calls.
//!
//! The one exception to "the CLI reaches the kernels only through the `attn` library": this
//! command and its submodules use `attn_kernels` directly, for what a benchmark needs and the
//! library does not offer (the problem sizes `Dims` and the band of a mask for the FLOP count,
//! the instruction sets for `--peak`, and `--backward`'s direct kernel calls, which time the
//! kernels without the autograd graph around them).

use std::time::Duration;

mod backward;
mod delta;
mod inputs;
mod linear;
mod packed;
mod peak;
mod report;
mod sparse;
mod spec;
mod vs_full;

use anyhow::{bail, Context};
use attn::{sdpa_full, SdpaOptions};
use attn_kernels::Dims;
use candle_core::DType;
use indicatif::{ProgressBar, ProgressStyle};

pub use spec::FLOP_RULE;

use super::sdpa_flags::{named_values, number_in, SdpaFlags};
use super::threads::Threads;
use crate::measure::{self, Budget, Measurement};
use inputs::KV_DTYPES;
use report::{header, json_row, print_peak, table_row, Row, BACKWARD_FLOPS};
use sparse::Sparse;
use vs_full::VsFull;

/// Arguments of `attn bench`.
#[derive(clap::Args, Debug)]
#[command(after_help = FLOP_RULE)]
pub struct Args {
    /// Problem size B,H,Lq,D: q is [B, H, Lq, D]; repeat the flag for several shapes.
    #[arg(long = "shape", value_name = "B,H,Lq,D")]
    pub shapes: Vec<String>,
    /// Key/value length Lk (default Lq).
    #[arg(long, value_name = "Lk", allow_negative_numbers = true)]
    pub kv_len: Option<usize>,
    /// Key/value heads Hkv (default H; H must be a multiple), for grouped-query attention.
    #[arg(long, value_name = "Hkv", allow_negative_numbers = true)]
    pub kv_heads: Option<usize>,
    /// Value head dimension Dv (default D).
    #[arg(long, value_name = "Dv", allow_negative_numbers = true)]
    pub dv: Option<usize>,
    #[command(flatten)]
    pub sdpa: SdpaFlags,
    /// Storage type of keys and values (queries and output are f32).
    #[arg(long, default_value = "f32", value_parser = named_values(&KV_DTYPES, |d: DType| d.as_str()))]
    pub kv_dtype: DType,
    #[command(flatten)]
    pub threads: Threads,
    /// Untimed calls before timing.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub warmup: usize,
    /// Most timed calls per shape.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    pub iters: usize,
    /// Stop timing a shape once this many seconds were spent and 3 calls made ("inf": always
    /// make --iters calls).
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", allow_negative_numbers = true,
          value_parser = parse_budget)]
    pub budget: f64,
    /// Seed of the random inputs (`--seed` is the dropout seed).
    #[arg(long, default_value_t = 0x5eed, allow_negative_numbers = true)]
    pub data_seed: u64,
    /// Print one JSON object per shape per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also measure the FMA peak GFLOP/s of one core and of all threads, with the kernel's
    /// instructions (AVX2 when flash-avx2 is forced, else the widest this CPU has), and report each
    /// shape's share of the all-thread peak.
    #[arg(long)]
    pub peak: bool,
    /// Time forward (with log-sum-exp) plus backward per call: the gradients of q, k and v for a
    /// fixed random output gradient (dropout replayed from --seed), by the kernels called
    /// directly with the library's parameters. FLOPs are then 3.5x the forward's (the backward
    /// counted as 2.5x the forward, FlashAttention's convention).
    #[arg(long)]
    pub backward: bool,
    /// With --backward, go through the library and candle's autograd instead (q, k, v as Vars,
    /// loss.backward()): the same kernels plus candle's element-wise work around them.
    #[arg(long, requires = "backward")]
    pub autograd: bool,
    /// Packed variable-length sequences: the lengths of the B sequences of --shape B,H,Lq,D (each
    /// at most Lq; keys as long as queries). Times attention over them packed, [L1+...+LB, H, D]
    /// cut by cu_seqlens (attn::sdpa_varlen), or with --padded the padded batch with these key
    /// lengths. FLOPs count each sequence's own pairs, for both.
    #[arg(long, value_name = "L1,...,LB", value_delimiter = ',', conflicts_with = "pattern")]
    pub seq_lens: Option<Vec<usize>>,
    /// Time linear attention with this feature map instead (the kernels called directly; with
    /// --causal the chunked form, with --backward forward plus backward). FLOPs: see the line the
    /// command prints.
    #[arg(long, value_name = "MAP", conflicts_with_all = ["seq_lens", "pattern", "autograd", "window", "softcap", "dropout"])]
    pub linear: Option<linear::BenchMap>,
    /// Time the gated delta rule instead (`gated`: Gated DeltaNet's chunked kernels, `kda`: Kimi
    /// Delta Attention's per-channel decay), the kernels called directly, `q` and `k`
    /// L2-normalised: --shape B,H,T,D is H value heads of key width D over T tokens, --kv-heads
    /// the key heads, --dv the value width; with --backward forward plus backward. FLOPs: see
    /// the line the command prints.
    #[arg(long, value_name = "RULE", conflicts_with_all = [
        "linear", "seq_lens", "pattern", "autograd", "window", "softcap", "dropout", "causal", "kv_len", "kv_dtype",
    ])]
    pub delta_rule: Option<super::run::DeltaRule>,
    /// Random features of `--linear favor`.
    #[arg(long, value_name = "M", default_value_t = 256, requires = "linear")]
    pub features: usize,
    /// Rows per chunk of `--linear` (the causal chunked form; also the blocks of the non-causal
    /// one).
    #[arg(long, value_name = "C", default_value_t = attn::linear::CHUNK, requires = "linear")]
    pub chunk: usize,
    /// Segments per head of `--linear`'s chunk-parallel path (0: chosen from the threads and
    /// heads; 1: the sequential form, parallel over heads only).
    #[arg(long, value_name = "S", default_value_t = 0, requires = "linear")]
    pub segments: usize,
    /// With --linear, the timed calls write into outputs (and gradients) allocated once before the
    /// loop (`linear_attention_into`), as a training loop that keeps its buffers does; without it
    /// each call allocates fresh ones, as `attn::linear_attention` does (their pages mapped and
    /// cleared by the kernel on every call).
    #[arg(long, requires = "linear")]
    pub reuse_outputs: bool,
    /// With --seq-lens, time the padded batch [B, H, Lq, D] with the lengths as key lengths
    /// instead of the packed sequences.
    #[arg(long, requires = "seq_lens")]
    pub padded: bool,
    /// With --pattern, time the pattern against the full call (no block mask, the other flags
    /// alike) in alternating rounds and report f (blocks computed over the full call's), the time
    /// ratio pattern/full (median of the rounds' ratios) and ratio/f.
    #[arg(long, requires = "pattern", conflicts_with = "autograd")]
    pub vs_full: bool,
    /// Rounds of --vs-full, each timing both calls (--iters calls each, within --budget).
    #[arg(long, default_value_t = 3, requires = "vs_full", allow_negative_numbers = true)]
    pub rounds: usize,
}

/// Runs `attn bench`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let cases = args
        .shapes
        .iter()
        .map(|s| spec::case_dims(spec::parse_shape(s)?, args.kv_len, args.kv_heads, args.dv))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if cases.is_empty() && !args.peak {
        bail!("nothing to do: give at least one --shape B,H,Lq,D (or --peak)");
    }
    if args.iters == 0 || args.rounds == 0 {
        bail!("--iters {} --rounds {}: both must be at least 1", args.iters, args.rounds);
    }
    let threads = args.threads.get();
    let pool = args.threads.pool()?;

    let peak = if args.peak { Some(peak::measure(threads, args.sdpa.kernel, args.sdpa.compute)) } else { None };
    if let Some(p) = peak {
        print_peak(&args, p, threads);
    }
    if let Some(rule) = args.delta_rule {
        return delta::main(&args, rule, cases, &pool, peak.flatten().map(|p| p.all_gflops));
    }
    if let Some(map) = args.linear {
        return linear::main(&args, map, cases, &pool, peak.flatten().map(|p| p.all_gflops));
    }
    let pattern = args.sdpa.pattern()?;
    let mut base = args.sdpa.options();
    if args.padded {
        base.key_lengths = args.seq_lens.clone();
    }
    for (i, dims) in cases.into_iter().enumerate() {
        if let Some(lens) = &args.seq_lens {
            packed::check(&dims, lens)?;
        }
        let shape = || format!("--shape {}", spec::shape_text(&dims));
        let sparse = pattern.as_ref().map(|p| Sparse::build(p, &dims, &pool)).transpose().with_context(shape)?;
        let opts = SdpaOptions { block_mask: sparse.as_ref().map(|s| s.mask.clone()), ..base.clone() };
        if let (true, Some(sparse)) = (args.vs_full, &sparse) {
            let budget = Budget { warmup: args.warmup, iters: args.iters, seconds: args.budget };
            let vs = VsFull::measure(&args, &pool, &opts, dims, budget, args.rounds).with_context(shape)?;
            match args.json {
                true => println!("{}", vs.json_row(&args, threads, &dims, sparse)),
                false if i == 0 => println!("{}\n{}", VsFull::header(), vs.table_row(&args, threads, &dims, sparse)),
                false => println!("{}", vs.table_row(&args, threads, &dims, sparse)),
            }
            continue;
        }
        let m = measure_case(&args, &pool, &opts, dims).with_context(shape)?;
        if i == 0 && !args.json {
            // After the first shape was measured, so that a refused shape prints nothing.
            if let Some(dropout) = args.sdpa.dropout_text() {
                println!("{dropout}");
            }
            if let Some(lens) = &args.seq_lens {
                let layout = if args.padded { "padded batch with key lengths" } else { "packed sequences" };
                println!(
                    "{layout} {lens:?} ({} tokens); FLOPs of the sequences' own pairs",
                    lens.iter().sum::<usize>()
                );
            }
            if args.backward {
                let path = if args.autograd { "through candle autograd" } else { "by the kernels directly" };
                println!("forward (with log-sum-exp) + backward per call, {path}; {BACKWARD_FLOPS}");
            }
            println!("{}", header(peak.flatten().is_some(), pattern.is_some()));
        }
        let forward_flops = match &args.seq_lens {
            Some(lens) => packed::flops(&dims, lens, &opts),
            None => spec::flops(&dims, &opts),
        };
        let flops = if args.backward { spec::with_backward(forward_flops) } else { forward_flops };
        let row = Row { dims, flops, m, blocks: spec::blocks(&dims, &opts), sparse };
        let peak_all = peak.flatten().map(|p| p.all_gflops);
        if args.json {
            println!("{}", json_row(&args, threads, &row, peak_all));
        } else {
            println!("{}", table_row(&args, threads, &row, peak_all));
        }
    }
    Ok(())
}

/// Times one shape as `args` say, in `pool`, with a spinner counting the calls.
fn measure_case(args: &Args, pool: &rayon::ThreadPool, opts: &SdpaOptions, dims: Dims) -> anyhow::Result<Measurement> {
    let budget = Budget { warmup: args.warmup, iters: args.iters, seconds: args.budget };
    if let Some(lens) = args.seq_lens.as_ref().filter(|_| !args.padded) {
        return measure_packed(args, pool, opts, dims, lens, budget);
    }
    let data = inputs::Inputs::random(dims, args.kv_dtype, args.data_seed)?;
    let bar = progress(&format!("--shape {}", spec::shape_text(&dims)));
    let started = || bar.inc(1);
    let m = if args.backward {
        let grad_out = backward::grad_out(dims, args.data_seed)?;
        if args.autograd {
            let t = backward::Trainable::new(&data, grad_out)?;
            measure::measure(budget, || {
                started();
                pool.install(|| t.step(opts))
            })
        } else {
            let h = backward::HostCase::new(&data, dims, &grad_out)?;
            measure::measure(budget, || {
                started();
                pool.install(|| h.step(opts))
            })
        }
    } else {
        measure::measure(budget, || {
            started();
            Ok(pool.install(|| sdpa_full(&data.q, &data.k, &data.v, opts))?)
        })
    };
    bar.finish_and_clear();
    m
}

/// Times the packed sequences `lens` as `args` say, in `pool`.
fn measure_packed(
    args: &Args,
    pool: &rayon::ThreadPool,
    opts: &SdpaOptions,
    dims: Dims,
    lens: &[usize],
    budget: Budget,
) -> anyhow::Result<Measurement> {
    let data = packed::PackedInputs::random(&dims, lens, args.kv_dtype, args.data_seed)?;
    let bar = progress(&format!("--shape {} --seq-lens", spec::shape_text(&dims)));
    let m = if !args.backward {
        measure::measure(budget, || {
            bar.inc(1);
            Ok(pool.install(|| data.forward(opts))?)
        })
    } else if args.autograd {
        measure::measure(budget, || {
            bar.inc(1);
            pool.install(|| data.autograd_step(opts))
        })
    } else {
        let host = packed::HostPacked::new(&data)?;
        measure::measure(budget, || {
            bar.inc(1);
            pool.install(|| host.step(opts))
        })
    };
    bar.finish_and_clear();
    m
}

fn parse_budget(s: &str) -> Result<f64, String> {
    number_in(s, |x: f64| x >= 0.0, "[0, inf]")
}

/// A spinner on stderr counting the calls started for `shape` (warm-up included), with the time
/// spent; hidden when stderr is not a terminal.
fn progress(shape: &str) -> ProgressBar {
    let style = ProgressStyle::with_template("{spinner} {msg}: {pos} calls, {elapsed}").expect("the template is valid");
    let bar = ProgressBar::new_spinner().with_style(style).with_message(shape.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
