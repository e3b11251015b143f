//! The training loop of the translator: teacher-forced cross-entropy, AdamW with warm-up and
//! cosine decay, gradient clipping, held-out exact-match evaluation, checkpoints at intervals, at
//! the end and when stopped, and the loss and accuracy curves drawn into the run's folder.
//!
//! A run is exactly resumable: batch `k` and step `k`'s dropout masks are pure functions of the
//! seed and `k`, the initialisation is seeded, and the checkpoint holds the optimiser's moments.
//! Progress goes to an [`Observer`] (the command line draws a progress bar); a stop flag, checked
//! between steps, ends the run with a checkpoint.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use attn::chart::{draw_lines, LineChart, Series};
use attn_nn::{Mode, Run};
use candle_core::{Device, Var};
use candle_nn::VarMap;

use crate::checkpoint::{self, Evaluation, History, Manifest, FORMAT};
use crate::data::{vocab, Batch, PackedBatch};
use crate::error::{Result, TrainError};
use crate::loss::masked_cross_entropy;
use crate::model::ModelConfig;
use crate::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::schedule::Schedule;
use crate::settings::{TaskSpec, TrainSettings};
use crate::task::Task;
use crate::translate::Translator;

/// Steps averaged into one point of the loss curve.
pub const LOSS_EVERY: u64 = 25;

/// One finished step.
#[derive(Debug, Clone, Copy)]
pub struct StepReport {
    /// Steps done (this one included).
    pub done: u64,
    /// Steps of the run.
    pub total: u64,
    /// This step's loss.
    pub loss: f64,
    /// Its learning rate.
    pub lr: f64,
    /// Its gradient norm before clipping.
    pub grad_norm: f64,
    /// Target and source tokens it processed.
    pub tokens: usize,
    /// Its wall time in seconds.
    pub seconds: f64,
}

/// What the loop tells the outside world.
pub trait Observer {
    /// The run starts with `done` of `total` steps made.
    fn started(&mut self, done: u64, total: u64);
    /// A step finished.
    fn step(&mut self, report: &StepReport);
    /// The held-out set was evaluated.
    fn evaluated(&mut self, evaluation: &Evaluation);
    /// A checkpoint was saved after `done` steps.
    fn saved(&mut self, done: u64, dir: &Path);
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every step was made.
    Finished,
    /// Stopped early (checkpoint saved) after this many steps.
    Stopped(u64),
}

/// A training run bound to its folder.
pub struct Trainer {
    translator: Translator,
    map: VarMap,
    /// The parameters in name order (for clipping).
    vars: Vec<Var>,
    opt: AdamW,
    task: Task,
    dir: PathBuf,
}

impl Trainer {
    /// A fresh run into `dir`, created if missing; refused if it holds any file (a checkpoint, or
    /// files the trainer did not write). `model.vocab` is replaced by the task's vocabulary size,
    /// a missing held-out size by the default for the data, and a pairs file's path is stored
    /// absolute.
    pub fn start(dir: &Path, mut model: ModelConfig, mut train: TrainSettings) -> Result<Self> {
        train.check()?;
        if train.packed && !model.attention.is_softmax() {
            return Err(TrainError::Setting {
                field: "packed",
                reason: format!("packed batches need softmax attention, and the model's is {}", model.attention.name()),
            });
        }
        if let TaskSpec::Pairs(path) = &train.task {
            // Absolute, so a resumed run finds the file from any folder.
            let absolute =
                std::fs::canonicalize(path).map_err(|source| TrainError::Io { path: path.clone(), source })?;
            train.task = TaskSpec::Pairs(absolute);
        }
        check_new_folder(dir)?;
        let task = Task::open(&train, model.max_len)?;
        train.held_out = Some(task.held_out_of_total().0);
        let vocab = task.vocab();
        model.vocab = vocab.len();
        let manifest = Manifest {
            format: FORMAT.into(),
            step: 0,
            model,
            train,
            data: task.fingerprint(),
            history: History::default(),
        };
        // The model is built (and refused) before the folder exists: a refused run leaves nothing.
        let trainer = Self::assemble(dir, manifest, vocab, task, None)?;
        std::fs::create_dir_all(dir).map_err(|source| TrainError::Io { path: dir.to_path_buf(), source })?;
        Ok(trainer)
    }

    /// Continues the run saved in `dir`, optionally with a new total of `steps` (not below the
    /// steps made). Refused when the checkpoint changed since its save, or the data did.
    pub fn resume(dir: &Path, steps: Option<u64>) -> Result<Self> {
        let ck = checkpoint::load(dir)?;
        let mut manifest = ck.manifest;
        if let Some(steps) = steps {
            if steps < manifest.step {
                return Err(TrainError::Setting {
                    field: "steps",
                    reason: format!("{steps} is below the {} steps the checkpoint has made", manifest.step),
                });
            }
            manifest.train.steps = steps;
        }
        manifest.train.check()?;
        let task = Task::open(&manifest.train, manifest.model.max_len)?;
        task.check_unchanged(&manifest).map_err(|e| TrainError::Checkpoint(format!("{}: {e}", dir.display())))?;
        if task.vocab() != ck.vocab {
            return Err(TrainError::Checkpoint(format!(
                "{}: the data's vocabulary differs from the checkpoint's vocab.json",
                dir.display()
            )));
        }
        let state = checkpoint::load_optimizer(dir, manifest.step)?;
        let mut trainer = Self::assemble(dir, manifest, ck.vocab, task, Some(&ck.weights))?;
        let step = trainer.translator.manifest().step;
        trainer.opt.load_state(&state, step)?;
        Ok(trainer)
    }

    /// Builds the model (seeded, then overwritten by `weights` when resuming) and the optimiser.
    fn assemble(
        dir: &Path,
        manifest: Manifest,
        vocab: crate::data::Vocab,
        task: Task,
        weights: Option<&std::collections::HashMap<String, candle_core::Tensor>>,
    ) -> Result<Self> {
        let map = VarMap::new();
        let model = manifest.model.build(attn_nn::init::seeded(&map, manifest.train.seed))?;
        let named = map.data().lock().expect("the VarMap lock is not poisoned").clone();
        if let Some(weights) = weights {
            if weights.len() != named.len() {
                return Err(TrainError::Checkpoint(format!(
                    "model.safetensors has {} tensors, the model {}",
                    weights.len(),
                    named.len()
                )));
            }
            for (name, var) in &named {
                let t = weights
                    .get(name)
                    .ok_or_else(|| TrainError::Checkpoint(format!("model.safetensors: `{name}` is missing")))?;
                var.set(t).map_err(|e| TrainError::Checkpoint(format!("model.safetensors: `{name}`: {e}")))?;
            }
        }
        let mut names: Vec<&String> = named.keys().collect();
        names.sort();
        let vars = names.iter().map(|n| named[*n].clone()).collect();
        let cfg = AdamWConfig { weight_decay: manifest.train.weight_decay, ..AdamWConfig::default() };
        let opt = AdamW::new(named, cfg)?;
        Ok(Self {
            translator: Translator::from_parts(model, vocab, manifest),
            map,
            vars,
            opt,
            task,
            dir: dir.to_path_buf(),
        })
    }

    /// The manifest as it stands (step, settings, history).
    pub fn manifest(&self) -> &Manifest {
        self.translator.manifest()
    }

    /// Trains until the last step or until `stop` is set; saves a checkpoint at each interval, at
    /// the end and when stopped.
    pub fn run(&mut self, observer: &mut dyn Observer, stop: &AtomicBool) -> Result<Outcome> {
        let train = self.manifest().train.clone();
        let first = self.manifest().step;
        observer.started(first, train.steps);
        let mut interval = (0.0, 0u64);
        let mut saved = None;
        for step in first..train.steps {
            if stop.load(Ordering::Relaxed) {
                if saved != Some(step) {
                    self.flush_loss(&mut interval);
                    self.save(observer)?;
                }
                return Ok(Outcome::Stopped(step));
            }
            let report = self.step()?;
            interval = (interval.0 + report.loss, interval.1 + 1);
            if (step + 1) % LOSS_EVERY == 0 {
                self.flush_loss(&mut interval);
            }
            observer.step(&report);
            let done = step + 1;
            if done % train.eval_every == 0 || done == train.steps {
                let evaluation = Evaluation { step: done, accuracy: self.evaluate()? };
                self.translator.manifest_mut().history.evaluations.push(evaluation);
                observer.evaluated(&evaluation);
            }
            if done % train.checkpoint_every == 0 || done == train.steps {
                self.flush_loss(&mut interval);
                self.save(observer)?;
                saved = Some(done);
            }
        }
        Ok(Outcome::Finished)
    }

    /// The padded batch of training step `step` (0-based): what [`Trainer::step`] trains on at
    /// that step, a pure function of the seed and `step`.
    pub fn batch(&self, step: u64) -> Result<Batch> {
        Ok(Batch::new(&self.task.batch(step, self.manifest().train.batch), self.translator.vocab(), &Device::Cpu)?)
    }

    /// [`Trainer::batch`]`(step)`'s pairs packed: what [`Trainer::step`] trains on with
    /// `packed` set.
    pub fn packed_batch(&self, step: u64) -> Result<PackedBatch> {
        PackedBatch::new(&self.task.batch(step, self.manifest().train.batch), self.translator.vocab(), &Device::Cpu)
    }

    /// The model and vocabulary being trained.
    pub fn translator(&self) -> &Translator {
        &self.translator
    }

    /// Makes the run's next step, step `k = manifest().step`, and nothing else (no evaluation, no
    /// checkpoint): forward on [`Trainer::batch`]`(k)` with step `k`'s dropout, masked
    /// cross-entropy, backward, gradient clipping and an AdamW update at the schedule's rate. With
    /// `packed` set, forward on [`Trainer::packed_batch`]`(k)` instead: the same sequences, the
    /// same loss.
    pub fn step(&mut self) -> Result<StepReport> {
        let start = Instant::now();
        let step = self.manifest().step;
        let train = &self.manifest().train;
        let (total, clip, lr) = (train.steps, train.clip, Schedule::of_run(train).lr(step));
        let model = self.translator.model();
        let (loss, tokens) = if train.packed {
            let batch = self.packed_batch(step)?;
            let logits = model.forward_packed(&batch.src, &batch.tgt_in, Mode::TrainStep(step))?; // [total_t, V]
            (masked_cross_entropy(logits.data(), &batch.tgt_out, vocab::PAD)?.0, batch.src_tokens + batch.tgt_tokens)
        } else {
            let batch = self.batch(step)?;
            let logits = model.forward(&batch.src, &batch.tgt_in, Run::train_step(step))?.out; // [B, Lt, V]
            (masked_cross_entropy(&logits, &batch.tgt_out, vocab::PAD)?.0, batch.src_tokens + batch.tgt_tokens)
        };
        let loss_value = f64::from(loss.to_scalar::<f32>()?);
        if !loss_value.is_finite() {
            return Err(TrainError::Setting {
                field: "lr",
                reason: format!("the loss became {loss_value} at step {step}; try a lower learning rate"),
            });
        }
        let mut grads = loss.backward()?;
        let grad_norm = clip_grad_norm(&self.vars, &mut grads, clip)?;
        self.opt.step(&grads, lr)?;
        self.translator.manifest_mut().step = step + 1;
        Ok(StepReport {
            done: step + 1,
            total,
            loss: loss_value,
            lr,
            grad_norm,
            tokens,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Appends the mean loss of the steps since the last point to the history.
    fn flush_loss(&mut self, interval: &mut (f64, u64)) {
        if interval.1 > 0 {
            let m = self.translator.manifest_mut();
            m.history.loss.push((m.step, interval.0 / interval.1 as f64));
        }
        *interval = (0.0, 0);
    }

    /// Exact-match accuracy on the held-out pairs.
    pub fn evaluate(&self) -> Result<f64> {
        let held_out = self.task.held_out();
        let sources: Vec<String> = held_out.iter().map(|(s, _)| s.clone()).collect();
        let outputs = self.translator.translate(&sources)?;
        let right = outputs.iter().zip(&held_out).filter(|(o, (_, t))| o == &t).count();
        Ok(right as f64 / held_out.len().max(1) as f64)
    }

    /// `(held out, total)`: the pairs (dates for the dates task) held out for evaluation, of how
    /// many.
    pub fn held_out_of_total(&self) -> (usize, usize) {
        self.task.held_out_of_total()
    }

    /// Saves the checkpoint and draws the curves.
    fn save(&self, observer: &mut dyn Observer) -> Result<()> {
        let weights = self
            .map
            .data()
            .lock()
            .expect("the VarMap lock is not poisoned")
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect();
        let m = self.manifest();
        checkpoint::save(&self.dir, m, self.translator.vocab(), weights, self.opt.state())?;
        draw_curves(&self.dir, &m.history)?;
        observer.saved(m.step, &self.dir);
        Ok(())
    }
}

/// Refuses `dir` for a fresh run unless it is missing or empty: a folder holding a checkpoint is
/// pointed to resuming it, any other file is named (the first few).
fn check_new_folder(dir: &Path) -> Result<()> {
    const SHOWN: usize = 5;
    let io = |source| TrainError::Io { path: dir.to_path_buf(), source };
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        entries => entries
            .map_err(io)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()
            .map_err(io)?,
    };
    if names.is_empty() {
        return Ok(());
    }
    if checkpoint::read_manifest(dir).is_ok() {
        return Err(TrainError::HoldsCheckpoint { path: dir.to_path_buf() });
    }
    names.sort();
    let more = names.len().saturating_sub(SHOWN);
    let mut files: Vec<String> = names
        .into_iter()
        .take(SHOWN)
        .map(|n| if n == "config.json" { "config.json, not a checkpoint of attn train".into() } else { n })
        .collect();
    if more > 0 {
        files.push(format!("and {more} more"));
    }
    Err(TrainError::ForeignFiles { path: dir.to_path_buf(), files })
}

/// `loss.png` (log scale) and, once evaluated, `accuracy.png` in `dir`.
pub fn draw_curves(dir: &Path, history: &History) -> Result<()> {
    let chart = |title: &str, y: &str, log_y: bool, name: &str, points: Vec<(f64, f64)>| LineChart {
        title: title.into(),
        x_label: "step".into(),
        y_label: y.into(),
        log_x: false,
        log_y,
        series: vec![Series { name: name.into(), points }],
    };
    if !history.loss.is_empty() {
        let points = history.loss.iter().map(|&(s, l)| (s as f64, l)).collect();
        draw_lines(
            &dir.join("loss.png"),
            &chart("training loss", "cross-entropy per token", true, "train loss", points),
        )?;
    }
    if !history.evaluations.is_empty() {
        let points = history.evaluations.iter().map(|e| (e.step as f64, 100.0 * e.accuracy)).collect();
        draw_lines(&dir.join("accuracy.png"), &chart("held-out exact match", "% exact", false, "exact match", points))?;
    }
    Ok(())
}
