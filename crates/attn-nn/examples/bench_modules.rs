//! Times forward plus backward of one [`EncoderLayer`] or of an encoder-decoder [`Transformer`],
//! the Rust side of `scripts/modules_vs_torch.py` (PyTorch's `nn.TransformerEncoderLayer` and
//! `nn.Transformer` on the same sizes).
//!
//! A call: the module's forward in training mode with dropout 0 (the target causal in the
//! Transformer, no other masks), the loss `sum(out · g)` for a fixed random `g: [B, L, d_model]`,
//! and the backward to every parameter (the inputs are constants, as in PyTorch where they do not
//! require gradients). Weights come from [`attn_nn::init::seeded`], inputs from
//! [`attn::random::uniform`] in `[-1, 1)`. `--warmup` untimed calls (at least one, which also checks
//! that the backward reaches every parameter), then `--iters` timed ones.
//!
//! Threads: the calls run on a rayon pool's thread ([`attn_nn::threads::on_workers`]), as the
//! `attn` command runs its work; candle's matrix products and the attention kernels use
//! `RAYON_NUM_THREADS` (default:
//! all cores); candle's element-wise pool uses `CANDLE_NUM_THREADS`, 1 unless given, as in the
//! `attn` binary (see [`attn_nn::threads`]). Freed buffers stay in the heap for reuse, as in the
//! binary too ([`attn_nn::memory`]).
//!
//! ```sh
//! RAYON_NUM_THREADS=2 cargo run --release -p attn-nn --example bench_modules -- --module encoder-layer
//! RAYON_NUM_THREADS=2 cargo run --release -p attn-nn --example bench_modules -- --module transformer
//! ```
//!
//! prints one JSON line: the sizes, the threads, the seconds spent building the module and inputs,
//! each timed call's seconds, their median and minimum.

/// The allocator of the `attn` binary (`attn-cli`'s `alloc_meter`), so that this benchmark
/// allocates as `attn` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{bail, ensure};
use attn_nn::{AttnMasks, EncoderLayer, LayerConfig, Run, Seq2SeqMasks, Transformer, TransformerConfig};
use candle_nn::VarMap;
use clap::{Parser, ValueEnum};
use serde_json::json;

/// What is timed.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum Module {
    /// One post-norm encoder layer on `[B, L, d_model]`.
    EncoderLayer,
    /// `--layers` encoder and `--layers` decoder layers with final norms, source and target of
    /// length L.
    Transformer,
}

/// Times forward plus backward of a Transformer module.
#[derive(Parser)]
struct Args {
    #[arg(long, value_enum)]
    module: Module,
    /// Sequences per call.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Sequence length (source and target) [default: 512 for encoder-layer, 256 for transformer].
    #[arg(long)]
    len: Option<usize>,
    /// Model width.
    #[arg(long, default_value_t = 512)]
    d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Feed-forward width.
    #[arg(long, default_value_t = 2048)]
    ff: usize,
    /// Encoder layers and decoder layers (each) of the Transformer.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Untimed calls first (at least one is made).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed calls.
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Seed of the weights and inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// The module under test.
enum Model {
    Encoder(Box<EncoderLayer>),
    Transformer(Transformer),
}

fn main() -> anyhow::Result<()> {
    attn_nn::process::setup();
    let a = Args::parse();
    ensure!(a.iters > 0 && a.batch > 0, "--iters and --batch must be positive");
    let setup = std::time::Instant::now();
    let (name, default_len) = match a.module {
        Module::EncoderLayer => ("encoder-layer", 512),
        Module::Transformer => ("transformer", 256),
    };
    let len = a.len.unwrap_or(default_len);
    let layer = LayerConfig { dim_feedforward: a.ff, dropout: 0.0, ..LayerConfig::new(a.d_model, a.heads) };
    let map = VarMap::new();
    let vb = attn_nn::init::seeded(&map, a.seed);
    let model = match a.module {
        Module::EncoderLayer => Model::Encoder(Box::new(EncoderLayer::new(&layer, vb)?)),
        Module::Transformer => {
            let cfg = TransformerConfig { layer, num_encoder_layers: a.layers, num_decoder_layers: a.layers };
            Model::Transformer(Transformer::new(&cfg, vb)?)
        }
    };
    let shape = [a.batch, len, a.d_model];
    let src = attn::random::uniform(&shape, -1.0, 1.0, a.seed + 1)?;
    let tgt = attn::random::uniform(&shape, -1.0, 1.0, a.seed + 2)?;
    let g = attn::random::uniform(&shape, -1.0, 1.0, a.seed + 3)?;
    let vars = map.all_vars();
    let masks = Seq2SeqMasks { tgt: AttnMasks::causal(), ..Seq2SeqMasks::default() };
    let call = || -> anyhow::Result<usize> {
        let out = match &model {
            Model::Encoder(m) => m.forward(&src, &AttnMasks::default(), Run::train())?.out,
            Model::Transformer(m) => m.forward(&src, &tgt, &masks, Run::train())?.out,
        };
        let grads = (out * &g)?.sum_all()?.backward()?;
        Ok(vars.iter().filter(|v| grads.get(v.as_tensor()).is_some()).count())
    };
    let setup_s = setup.elapsed().as_secs_f64();
    let timed = || -> anyhow::Result<Vec<f64>> {
        let reached = call()?;
        if reached != vars.len() {
            bail!("the backward reached {reached} of {} parameters", vars.len());
        }
        for _ in 1..a.warmup {
            call()?;
        }
        let mut times = Vec::with_capacity(a.iters);
        for _ in 0..a.iters {
            let start = std::time::Instant::now();
            call()?;
            times.push(start.elapsed().as_secs_f64());
        }
        Ok(times)
    };
    let times = attn_nn::threads::on_workers(timed)??;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = (sorted[(n - 1) / 2] + sorted[n / 2]) / 2.0;
    let row = json!({
        "module": name,
        "batch": a.batch, "len": len, "d_model": a.d_model, "heads": a.heads, "ff": a.ff,
        "layers": match a.module { Module::EncoderLayer => 1, Module::Transformer => a.layers },
        "params": vars.iter().map(|v| v.elem_count()).sum::<usize>(),
        "rayon_threads": candle_core::utils::get_num_threads(),
        "candle_threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_default(),
        "setup_s": setup_s, "warmup": a.warmup, "times_s": times,
        "median_s": median, "min_s": sorted[0],
    });
    println!("{row}");
    Ok(())
}
