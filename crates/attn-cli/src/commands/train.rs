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
use clap::Args as _;
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
    #[arg(long, conflicts_with_all = resume_conflicts())]
    pub resume: bool,
    /// Total optimiser steps (default 2500; with --resume, the saved total).
    #[arg(long)]
    pub steps: Option<u64>,
    #[command(flatten)]
    pub model: ModelConfig,
    #[command(flatten)]
    pub settings: TrainSettings,
    #[command(flatten)]
    pub threads: Threads,
}

/// What a resumed run takes from its checkpoint instead: the data (`--task`, `--data`) and every
/// flag of [`ModelConfig`] and [`TrainSettings`], read from their derived arguments.
fn resume_conflicts() -> Vec<clap::Id> {
    let settings = TrainSettings::augment_args(ModelConfig::augment_args(clap::Command::new("settings")));
    let flags = settings.get_arguments().map(|a| a.get_id().clone());
    ["task", "data"].into_iter().map(clap::Id::from).chain(flags).collect()
}

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
    /// Tokens and seconds of this session's steps (evaluations and saves not counted).
    session: (usize, f64),
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
        self.session = (self.session.0 + r.tokens, self.session.1 + r.seconds);
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
        super::say(&self.bar, line);
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
        let task = match &args.data {
            Some(path) => TaskSpec::Pairs(path.clone()),
            None => TaskSpec::Dates,
        };
        let steps = args.steps.unwrap_or(args.settings.steps);
        let settings = TrainSettings { task, steps, ..args.settings.clone() };
        Trainer::start(&args.out, args.model, settings).map_err(|e| start_error(e, &args.out))?
    };
    let (held, total) = trainer.held_out_of_total();
    let unit = if trainer.manifest().train.task == TaskSpec::Dates { "dates" } else { "pairs" };
    let how = if args.resume || args.settings.held_out.is_some() {
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
    let mut bar = Bar { bar: ProgressBar::new(0).with_style(style), tokens_per_second: 0.0, session: (0, 0.0) };
    let outcome = pool.install(|| trainer.run(&mut bar, &stop)).map_err(|e| {
        if args.resume {
            resume_error(e)
        } else {
            with_flag::<Args>(e)
        }
    })?;
    bar.bar.finish_and_clear();
    let m = trainer.manifest();
    let (tokens, seconds) = bar.session;
    let batches = if m.train.packed { "packed" } else { "padded" };
    println!(
        "training speed: {:.0} tokens/s over this session's steps ({batches} batches)",
        tokens as f64 / seconds.max(1e-9)
    );
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::{Args as _, FromArgMatches as _};

    use super::*;

    fn command() -> clap::Command {
        Args::augment_args(clap::Command::new("train"))
    }

    /// `attn train` with `extra` after `--out run`, parsed as the binary parses it.
    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let argv = ["train", "--out", "run"].iter().chain(extra);
        Args::from_arg_matches(&command().try_get_matches_from(argv)?)
    }

    /// The field names of a settings struct, read from its serialised form (not from clap).
    fn fields(value: impl serde::Serialize) -> Vec<String> {
        serde_json::to_value(value).unwrap().as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn every_setting_field_is_a_flag_named_after_it() {
        let command = command();
        let mut all = fields(ModelConfig::default());
        all.extend(fields(TrainSettings::default()));
        // `vocab` comes from the data, never from a flag.
        for field in all.iter().filter(|f| *f != "vocab") {
            let arg = command.get_arguments().find(|a| a.get_id() == field.as_str());
            let long = arg.and_then(|a| a.get_long());
            assert_eq!(long, Some(field.replace('_', "-").as_str()), "field {field}");
        }
    }

    #[test]
    fn flags_default_to_the_libraries_defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.model, ModelConfig::default());
        assert_eq!(args.settings, TrainSettings::default());
        assert_eq!(args.steps, None);
        let steps = command().get_arguments().find(|a| a.get_id() == "steps").unwrap().get_help().unwrap().to_string();
        assert!(steps.contains(&format!("default {}", TrainSettings::default().steps)), "{steps}");
    }

    #[test]
    fn resume_refuses_every_setting_but_steps_and_threads() {
        let free = ["out", "resume", "steps", "threads"];
        let command = command();
        let settings: Vec<&clap::Arg> =
            command.get_arguments().filter(|a| !a.get_long().is_some_and(|l| free.contains(&l))).collect();
        let ids: BTreeSet<&str> = settings.iter().map(|a| a.get_id().as_str()).collect();
        let conflicts = resume_conflicts();
        assert_eq!(ids, conflicts.iter().map(clap::Id::as_str).collect());
        for arg in settings {
            let long = format!("--{}", arg.get_long().unwrap());
            let value = arg.get_possible_values().first().map_or("1".to_string(), |v| v.get_name().to_string());
            // A switch (`--packed`) takes no value.
            let given: Vec<&str> = if arg.get_action().takes_values() { vec![&long, &value] } else { vec![&long] };
            assert!(parse(&given).is_ok(), "{given:?} alone");
            let refused = parse(&[&["--resume"][..], &given].concat()).unwrap_err();
            assert_eq!(refused.kind(), clap::error::ErrorKind::ArgumentConflict, "{long}");
        }
        let resumed = parse(&["--resume", "--steps", "30", "--threads", "1"]).unwrap();
        assert!(resumed.resume && resumed.steps == Some(30));
    }
}
