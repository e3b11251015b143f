//! `attn train`: trains the sequence-to-sequence translator (`attn_train::Trainer`) on the built-in
//! dates task or a user's `SOURCE<TAB>TARGET` file, with a progress bar (step, loss, tokens/s,
//! ETA), a line per held-out evaluation, checkpoints into `--out`, and Ctrl-C stopping after the
//! current step with a checkpoint saved (exit status 130). The library's refusals of a setting
//! are named by the flag that gave it (on a fresh run; a resumed run's come from `config.json`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Context};
use attn_train::checkpoint::{Evaluation, Manifest};
use attn_train::data::{Date, DateFormat};
use attn_train::model::ModelConfig;
use attn_train::settings::{TaskSpec, TrainSettings};
use attn_train::trainer::{Observer, Outcome, StepReport, Trainer};
use attn_train::TrainError;
use indicatif::{ProgressBar, ProgressStyle};

use super::threads::Threads;
use super::{with_flag, Interrupted};

/// Arguments of `attn train`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Folder of the run: checkpoints, vocabulary, curves.
    #[arg(long)]
    pub out: PathBuf,
    /// Train on the built-in dates-to-ISO task (the default).
    #[arg(long, conflicts_with = "data")]
    pub task: Option<TaskName>,
    /// Train on your own pairs: one `SOURCE<TAB>TARGET` per line.
    #[arg(long, value_name = "PAIRS.tsv")]
    pub data: Option<PathBuf>,
    /// Continue the run saved in --out exactly, with its saved settings (only --steps, to extend
    /// it, and --threads may be given).
    #[arg(long, conflicts_with_all = RESUME_CONFLICTS)]
    pub resume: bool,
    /// Total optimiser steps (default 2500; with --resume, the saved total).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per step.
    #[arg(long, default_value_t = TrainSettings::default().batch)]
    pub batch: usize,
    /// Model width.
    #[arg(long, default_value_t = ModelConfig::default().d_model)]
    pub d_model: usize,
    /// Encoder layers and decoder layers (each).
    #[arg(long, default_value_t = ModelConfig::default().layers)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = ModelConfig::default().heads)]
    pub heads: usize,
    /// Feed-forward width.
    #[arg(long, default_value_t = ModelConfig::default().ff)]
    pub ff: usize,
    /// Dropout.
    #[arg(long, default_value_t = ModelConfig::default().dropout)]
    pub dropout: f32,
    /// Longest sequence in positions (characters + 1).
    #[arg(long, default_value_t = ModelConfig::default().max_len)]
    pub max_len: usize,
    /// Peak learning rate (after warm-up).
    #[arg(long, default_value_t = TrainSettings::default().lr)]
    pub lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = TrainSettings::default().warmup)]
    pub warmup: u64,
    /// Global gradient-norm limit.
    #[arg(long, default_value_t = TrainSettings::default().clip)]
    pub clip: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = TrainSettings::default().weight_decay)]
    pub weight_decay: f64,
    /// Seed of initialisation, data order and dropout.
    #[arg(long, default_value_t = TrainSettings::default().seed)]
    pub seed: u64,
    /// Held-out pairs (dates for the dates task) for exact-match evaluation, never trained on
    /// (default: 5% of the data, at least 1, at most 1000).
    #[arg(long)]
    pub held_out: Option<usize>,
    /// Steps between evaluations.
    #[arg(long, default_value_t = TrainSettings::default().eval_every)]
    pub eval_every: u64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = TrainSettings::default().checkpoint_every)]
    pub checkpoint_every: u64,
    #[command(flatten)]
    pub threads: Threads,
}

/// Settings a resumed run takes from its checkpoint instead.
const RESUME_CONFLICTS: [&str; 17] = [
    "task",
    "data",
    "batch",
    "d_model",
    "layers",
    "heads",
    "ff",
    "dropout",
    "max_len",
    "lr",
    "warmup",
    "clip",
    "weight_decay",
    "seed",
    "held_out",
    "eval_every",
    "checkpoint_every",
];

/// The built-in tasks.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum TaskName {
    /// Dates in fourteen forms → YYYY-MM-DD.
    Dates,
}

/// Draws the progress bar and prints evaluations and saves above it.
struct Bar {
    bar: ProgressBar,
    tokens_per_second: f64,
}

impl Observer for Bar {
    fn started(&mut self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.reset_eta();
    }

    fn step(&mut self, r: &StepReport) {
        let now = r.tokens as f64 / r.seconds.max(1e-9);
        self.tokens_per_second =
            if self.tokens_per_second == 0.0 { now } else { 0.9 * self.tokens_per_second + 0.1 * now };
        self.bar.set_position(r.done);
        self.bar.set_message(format!("loss {:.4} · lr {:.2e} · {:.0} tok/s", r.loss, r.lr, self.tokens_per_second));
    }

    fn evaluated(&mut self, e: &Evaluation) {
        self.say(format!("step {:>6}: held-out exact match {:.2}%", e.step, 100.0 * e.accuracy));
    }

    fn saved(&mut self, done: u64, dir: &std::path::Path) {
        self.say(format!("step {done:>6}: checkpoint saved in {} ({})", dir.display(), self.bar.message()));
    }
}

impl Bar {
    /// A line above the bar, or on standard output when there is no terminal to draw it on.
    fn say(&self, line: String) {
        if self.bar.is_hidden() {
            println!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

/// `attn train --help`'s closing text: the dates task's fourteen forms, shown for 2021-03-14.
pub fn dates_forms_help() -> String {
    let date = Date::new(2021, 3, 14).expect("2021-03-14 is a date");
    let forms: Vec<String> = DateFormat::ALL.iter().map(|f| format!("  {}", f.render(date))).collect();
    format!(
        "The dates task writes a date between 1950-01-01 and 2049-12-31 in one of fourteen forms, here \
         2021-03-14, and asks for YYYY-MM-DD:\n{}\nNN/NN/YYYY is month first (US: 03/14/2021); N.N.YYYY and \
         NN.NN.YYYY are day first (14.3.2021).",
        forms.join("\n")
    )
}

/// `e` as the user of `attn train` sees it: a fresh run's settings and folder come from flags.
fn start_error(e: TrainError, out: &Path) -> anyhow::Error {
    match e {
        TrainError::HoldsCheckpoint { .. } => anyhow!(
            "--out {}: already holds a checkpoint; continue it with --resume, or choose another folder",
            out.display()
        ),
        TrainError::ForeignFiles { .. } => anyhow!("--out {e}"),
        e => with_flag::<Args>(e),
    }
}

/// A resumed run's settings come from its `config.json`, but `--steps`.
fn resume_error(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::Setting { field: "steps", .. } => with_flag::<Args>(e),
        e => e.into(),
    }
}

/// The last evaluation: `12.50% exact at step 250`, or that there is none yet.
fn last_evaluation(m: &Manifest) -> String {
    m.history.evaluations.last().map_or("not evaluated yet".to_string(), |e| {
        format!("held-out exact match {:.2}% is from step {}", 100.0 * e.accuracy, e.step)
    })
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let pool = args.threads.pool()?;
    let mut trainer = if args.resume {
        let trainer = Trainer::resume(&args.out, args.steps).map_err(resume_error)?;
        let m = trainer.manifest();
        println!("resuming from step {} (of {})", m.step, m.train.steps);
        trainer
    } else {
        let model = ModelConfig {
            d_model: args.d_model,
            heads: args.heads,
            layers: args.layers,
            ff: args.ff,
            dropout: args.dropout,
            max_len: args.max_len,
            vocab: 0,
        };
        let task = match &args.data {
            Some(path) => TaskSpec::Pairs(path.clone()),
            None => TaskSpec::Dates,
        };
        let settings = TrainSettings {
            task,
            steps: args.steps.unwrap_or(TrainSettings::default().steps),
            batch: args.batch,
            lr: args.lr,
            warmup: args.warmup,
            clip: args.clip,
            weight_decay: args.weight_decay,
            seed: args.seed,
            held_out: args.held_out,
            eval_every: args.eval_every,
            checkpoint_every: args.checkpoint_every,
        };
        Trainer::start(&args.out, model, settings).map_err(|e| start_error(e, &args.out))?
    };
    let (held, total) = trainer.held_out_of_total();
    let unit = if trainer.manifest().train.task == TaskSpec::Dates { "dates" } else { "pairs" };
    let how = if args.resume || args.held_out.is_some() {
        ""
    } else {
        " (the default: 5%, at least 1, at most 1000; --held-out N to change)"
    };
    println!("held out for evaluation: {held} of the {total} {unit}{how}");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("cannot install the Ctrl-C handler")?;
    let style =
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps · {msg} · ETA {eta}").expect("the template is valid");
    let mut bar = Bar { bar: ProgressBar::new(0).with_style(style), tokens_per_second: 0.0 };
    let outcome = pool.install(|| trainer.run(&mut bar, &stop)).map_err(|e| {
        if args.resume {
            resume_error(e)
        } else {
            with_flag::<Args>(e)
        }
    })?;
    bar.bar.finish_and_clear();
    let m = trainer.manifest();
    match outcome {
        Outcome::Finished => {
            println!("trained {} steps; {}; model in {}", m.step, last_evaluation(m), args.out.display());
            Ok(())
        }
        Outcome::Stopped(done) => {
            println!(
                "stopped at step {done} of {}: checkpoint saved at step {done} in {} (continue with --resume); {}",
                m.train.steps,
                args.out.display(),
                last_evaluation(m)
            );
            Err(Interrupted.into())
        }
    }
}
