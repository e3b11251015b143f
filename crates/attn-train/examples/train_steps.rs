//! Times the real training step of `attn train`'s default configuration (the dates task, its
//! model and settings, seed 0) and exports the batches it trains on, so that
//! `scripts/train_vs_torch.py` can train PyTorch on exactly the same ones.
//!
//! Each step is [`Trainer::step`]: batch `k` of the seeded order, forward with step `k`'s dropout,
//! masked cross-entropy, backward, clipping and AdamW at the schedule's rate. The first `--warmup`
//! steps are reported but not counted in the steps per second. With `--export FILE`, the batches
//! of the `--steps` steps are written first (safetensors, replacing FILE only once complete):
//! `src.{k}: [B, Ls]`, `tgt_in.{k}` and `tgt_out.{k}: [B, Lt]` as `I64` token ids right-padded
//! with `pad = 0`, `lr: [K]` (`F64`, the rate of each step), and in the metadata `model` and `train`
//! (the configuration as JSON) and `pad`, `bos`, `eos` (the special ids).
//!
//! Threads: candle's matrix products and the attention kernels use `RAYON_NUM_THREADS` (default:
//! all cores); candle's element-wise pool uses `CANDLE_NUM_THREADS`, 1 unless given, as in the
//! `attn` binary (see [`attn_nn::threads`]); the steps run on a rayon pool's thread, as `attn
//! train` runs them ([`attn_nn::threads::on_workers`]). Freed buffers stay in the heap for reuse, as in the
//! binary too ([`attn_nn::memory`]).
//!
//! ```sh
//! RAYON_NUM_THREADS=2 cargo run --release -p attn-train --example train_steps -- \
//!     --steps 30 --warmup 5 --export batches.safetensors
//! ```
//!
//! prints one JSON line: the configuration, the threads, the seconds of setting up (task, model,
//! export), and per step its seconds, loss, gradient norm and tokens, then `steps_per_s` over the
//! timed steps.

/// The allocator of the `attn` binary (`attn-cli`'s `alloc_meter`), so that this benchmark
/// allocates as `attn` does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use attn_train::data::vocab;
use attn_train::model::ModelConfig;
use attn_train::schedule::Schedule;
use attn_train::settings::TrainSettings;
use attn_train::trainer::{StepReport, Trainer};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use serde_json::json;

/// Times `attn train`'s step on its default configuration and exports the batches.
#[derive(Parser)]
struct Args {
    /// Training steps made (steps 0..K of the run).
    #[arg(long, default_value_t = 30)]
    steps: u64,
    /// Of those, the first ones left out of the steps per second.
    #[arg(long, default_value_t = 5)]
    warmup: u64,
    /// Write the batches of the K steps to this safetensors file first.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    attn_nn::process::setup();
    let args = Args::parse();
    let total = TrainSettings::default().steps;
    if args.steps == 0 || args.warmup >= args.steps || args.steps > total {
        bail!("--steps {} must be larger than --warmup {} and at most the run's {total}", args.steps, args.warmup);
    }
    let setup = std::time::Instant::now();
    let run = tempfile::tempdir().context("creating a temporary run folder")?;
    let mut trainer = Trainer::start(run.path(), ModelConfig::default(), TrainSettings::default())?;
    if let Some(path) = &args.export {
        export(&trainer, args.steps, path)?;
    }
    let setup_s = setup.elapsed().as_secs_f64();
    let reports = attn_nn::threads::on_workers(|| {
        (0..args.steps).map(|_| trainer.step()).collect::<Result<Vec<StepReport>, _>>()
    })??;
    let timed: f64 = reports[args.warmup as usize..].iter().map(|r| r.seconds).sum();
    let m = trainer.manifest();
    let row = json!({
        "model": m.model,
        "train": m.train,
        "rayon_threads": candle_core::utils::get_num_threads(),
        "candle_threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_default(),
        "setup_s": setup_s,
        "steps": args.steps,
        "warmup": args.warmup,
        "step_s": reports.iter().map(|r| r.seconds).collect::<Vec<_>>(),
        "loss": reports.iter().map(|r| r.loss).collect::<Vec<_>>(),
        "grad_norm": reports.iter().map(|r| r.grad_norm).collect::<Vec<_>>(),
        "tokens": reports.iter().map(|r| r.tokens).collect::<Vec<_>>(),
        "steps_per_s": (args.steps - args.warmup) as f64 / timed,
    });
    println!("{row}");
    Ok(())
}

/// Writes the batches and rates of steps `0..steps` of `trainer`'s run to `path` (see the module
/// header).
fn export(trainer: &Trainer, steps: u64, path: &Path) -> anyhow::Result<()> {
    let m = trainer.manifest();
    let schedule = Schedule::of_run(&m.train);
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for k in 0..steps {
        let b = trainer.batch(k)?;
        for (name, ids) in [("src", &b.src), ("tgt_in", &b.tgt_in), ("tgt_out", &b.tgt_out)] {
            tensors.push((format!("{name}.{k}"), ids.to_dtype(DType::I64)?));
        }
    }
    let lrs: Vec<f64> = (0..steps).map(|k| schedule.lr(k)).collect();
    tensors.push(("lr".into(), Tensor::from_vec(lrs, steps as usize, &Device::Cpu)?));
    let metadata = HashMap::from([
        ("model".to_string(), serde_json::to_string(&m.model)?),
        ("train".to_string(), serde_json::to_string(&m.train)?),
        ("pad".to_string(), vocab::PAD.to_string()),
        ("bos".to_string(), vocab::BOS.to_string()),
        ("eos".to_string(), vocab::EOS.to_string()),
    ]);
    // The crate writes a temporary file beside `path` and renames it once complete.
    safetensors::serialize_to_file(tensors, Some(metadata), path).with_context(|| format!("writing {}", path.display()))
}
