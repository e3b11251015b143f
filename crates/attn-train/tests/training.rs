//! The training loop end to end on a tiny model: the loss falls, a run stopped and resumed ends
//! with exactly the weights of an uninterrupted run, a saved checkpoint translates like the model
//! that wrote it, and missing, truncated, mixed or foreign checkpoints are refused by name.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use attn_nn::Run;
use attn_train::checkpoint::{self, Evaluation};
use attn_train::data::vocab;
use attn_train::loss::masked_cross_entropy;
use attn_train::model::{Attention, ModelConfig};
use attn_train::settings::{TaskSpec, TrainSettings};
use attn_train::trainer::{Observer, Outcome, StepReport, Trainer};
use attn_train::translate::{Translator, Unanswered};
use attn_train::TrainError;

/// Records what the loop reports; raises the stop flag after `stop_after` steps.
struct Log<'a> {
    losses: Vec<f64>,
    evaluations: Vec<Evaluation>,
    saves: Vec<u64>,
    stop_after: Option<u64>,
    flag: &'a AtomicBool,
}

impl Observer for Log<'_> {
    fn started(&mut self, _done: u64, _total: u64) {}
    fn step(&mut self, r: &StepReport) {
        self.losses.push(r.loss);
        assert!(r.loss.is_finite() && r.grad_norm.is_finite() && r.lr > 0.0 && r.tokens > 0);
        if Some(r.done) == self.stop_after {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
    fn evaluated(&mut self, e: &Evaluation) {
        self.evaluations.push(*e);
    }
    fn saved(&mut self, done: u64, _dir: &Path) {
        self.saves.push(done);
    }
}

/// Runs `trainer`, asking it to stop after `stop_after` steps; returns how it ended and what it
/// reported.
fn run(trainer: &mut Trainer, stop_after: Option<u64>) -> (Outcome, Vec<f64>, Vec<Evaluation>, Vec<u64>) {
    let flag = AtomicBool::new(false);
    let mut log = Log { losses: Vec::new(), evaluations: Vec::new(), saves: Vec::new(), stop_after, flag: &flag };
    let outcome = trainer.run(&mut log, &flag).unwrap();
    (outcome, log.losses, log.evaluations, log.saves)
}

fn tiny() -> ModelConfig {
    ModelConfig { d_model: 16, heads: 2, layers: 1, ff: 32, dropout: 0.1, max_len: 40, ..ModelConfig::default() }
}

fn settings(steps: u64) -> TrainSettings {
    TrainSettings {
        task: TaskSpec::Dates,
        steps,
        batch: 16,
        lr: 3e-3,
        warmup: 10,
        clip: 1.0,
        weight_decay: 0.01,
        seed: 5,
        held_out: Some(20),
        eval_every: 20,
        checkpoint_every: 15,
        packed: false,
    }
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let ck = checkpoint::load(dir).unwrap();
    let mut w: Vec<_> =
        ck.weights.into_iter().map(|(n, t)| (n, t.flatten_all().unwrap().to_vec1::<f32>().unwrap())).collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

#[test]
fn loss_falls_and_checkpoints_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = Trainer::start(dir.path(), tiny(), settings(60)).unwrap();
    let (outcome, losses, evaluations, saves) = run(&mut trainer, None);
    assert_eq!(outcome, Outcome::Finished);
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[55..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.75 * first, "loss {first:.3} → {last:.3}");
    assert_eq!(saves, [15, 30, 45, 60]);
    assert_eq!(evaluations.iter().map(|e| e.step).collect::<Vec<_>>(), [20, 40, 60]);
    for f in ["config.json", "vocab.json", "model.safetensors", "optimizer.safetensors", "loss.png", "accuracy.png"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    let m = checkpoint::read_manifest(dir.path()).unwrap();
    assert_eq!((m.step, m.history.evaluations.len()), (60, 3));
    // A fresh run refuses to overwrite the checkpoint.
    let err = Trainer::start(dir.path(), tiny(), settings(60)).err().unwrap();
    assert!(matches!(err, TrainError::HoldsCheckpoint { .. }), "{err}");
}

/// A stop asked for just after a checkpoint saves nothing more: one save of that step.
#[test]
fn a_stop_right_after_a_checkpoint_saves_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = Trainer::start(dir.path(), tiny(), settings(40)).unwrap();
    let (outcome, _, _, saves) = run(&mut trainer, Some(15));
    assert_eq!(outcome, Outcome::Stopped(15));
    assert_eq!(saves, [15]);
}

/// `Trainer::step` trains on `Trainer::batch(k)` at step `k` (the batches `train_steps` exports
/// for the PyTorch comparison): its loss is that batch's loss through the model as it stands, with
/// step `k`'s dropout, and not the loss of the next batch.
#[test]
fn a_step_trains_on_the_batch_of_its_step() {
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = Trainer::start(dir.path(), tiny(), settings(10)).unwrap();
    let loss_of = |trainer: &Trainer, k: u64, batch: u64| {
        let b = trainer.batch(batch).unwrap();
        let logits = trainer.translator().model().forward(&b.src, &b.tgt_in, Run::train_step(k)).unwrap().out;
        let (loss, _) = masked_cross_entropy(&logits, &b.tgt_out, vocab::PAD).unwrap();
        (f64::from(loss.to_scalar::<f32>().unwrap()), b.src_tokens + b.tgt_tokens)
    };
    for k in 0..4 {
        let (expected, tokens) = loss_of(&trainer, k, k);
        let (next, _) = loss_of(&trainer, k, k + 1);
        assert_ne!(expected, next, "batches {k} and {} differ", k + 1);
        let r = trainer.step().unwrap();
        assert_eq!((r.done, r.loss, r.tokens), (k + 1, expected, tokens), "step {k}");
    }
}

/// A run of `settings` stopped after 9 steps and resumed ends with exactly the weights of the
/// uninterrupted run.
fn stopped_and_resumed_ends_like_uninterrupted(settings: TrainSettings) {
    let (whole, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut t = Trainer::start(whole.path(), tiny(), settings.clone()).unwrap();
    run(&mut t, None);

    let mut t = Trainer::start(parts.path(), tiny(), settings).unwrap();
    assert_eq!(run(&mut t, Some(9)).0, Outcome::Stopped(9));
    drop(t);
    assert_eq!(checkpoint::read_manifest(parts.path()).unwrap().step, 9);
    let mut t = Trainer::resume(parts.path(), None).unwrap();
    assert_eq!(run(&mut t, None).0, Outcome::Finished);
    assert_eq!(weights(whole.path()), weights(parts.path()), "resumed weights differ");
}

#[test]
fn a_stopped_and_resumed_run_ends_exactly_like_an_uninterrupted_one() {
    stopped_and_resumed_ends_like_uninterrupted(settings(24));
}

#[test]
fn a_stopped_and_resumed_packed_run_ends_exactly_like_an_uninterrupted_one() {
    stopped_and_resumed_ends_like_uninterrupted(TrainSettings { packed: true, ..settings(24) });
}

/// Packed and padded training without dropout make the same steps: the same loss at each step and
/// the same weights at the end, up to `f32` rounding (the packed model sums in another order).
/// Step 0's AdamW update is `lr·sign(g)` wherever `|g| ≫ ε`, so a gradient whose sign the rounding
/// flipped would show as a weight off by `2·lr`; the bound is far below that.
#[test]
fn packed_and_padded_training_make_the_same_steps() {
    let model = ModelConfig { dropout: 0.0, ..tiny() };
    let mut ends = Vec::new();
    let mut losses = Vec::new();
    for packed in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let settings = TrainSettings { packed, eval_every: 100, ..settings(6) };
        let mut t = Trainer::start(dir.path(), model, settings).unwrap();
        losses.push(run(&mut t, None).1);
        ends.push(weights(dir.path()));
    }
    for (step, (padded, packed)) in losses[0].iter().zip(&losses[1]).enumerate() {
        assert!((padded - packed).abs() <= 1e-5 * padded, "step {step}: loss {padded} padded, {packed} packed");
    }
    let (lr, d) = (settings(6).lr, model.d_model);
    for ((name, padded), (_, packed)) in ends[0].iter().zip(&ends[1]) {
        // The key bias (`in_proj_bias[d..2d]`) adds the same `q·b` to every score of a row, which
        // the softmax cancels: its gradient is 0 up to rounding, and AdamW scales that noise to
        // steps of `lr` whose sign is the noise's. It is the one parameter left out.
        let key_bias = if name.ends_with("in_proj_bias") { d..2 * d } else { 0..0 };
        let worst = padded
            .iter()
            .zip(packed)
            .enumerate()
            .filter(|(i, _)| !key_bias.contains(i))
            .map(|(_, (a, b))| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(f64::from(worst) <= 1e-3 * lr, "{name}: weights differ by {worst:e} after 6 steps (lr {lr})");
    }
}

/// A model with linear self-attention trains (its loss falls), records its kind in `config.json`
/// (softmax's checkpoints do not name theirs), and its checkpoint loads with that kind: the
/// translations equal the live model's greedy decoding through the recurrent caches. Packed
/// batches are refused for it, naming the setting.
#[test]
fn linear_attention_trains_saves_its_kind_and_translates() {
    let dir = tempfile::tempdir().unwrap();
    let model = ModelConfig { attention: Attention::LinearElu, ..tiny() };
    let mut t = Trainer::start(dir.path(), model, settings(60)).unwrap();
    let (_, losses, _, _) = run(&mut t, None);
    let (first, last) = (losses[..5].iter().sum::<f64>() / 5.0, losses[55..].iter().sum::<f64>() / 5.0);
    assert!(last < 0.75 * first, "loss {first:.3} → {last:.3}");
    let json = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(json.contains("\"attention\": \"linear-elu\""), "{json}");
    let translator = Translator::load(dir.path()).unwrap();
    assert_eq!(translator.manifest().model.attention, Attention::LinearElu);
    let texts = vec!["3 March 2021".to_string(), "Wed 3 Mar 2021".to_string()];
    let saved = translator.translate(&texts).unwrap();
    assert_eq!(saved, t.translator().translate(&texts).unwrap());

    let softmax = tempfile::tempdir().unwrap();
    let mut t = Trainer::start(softmax.path(), tiny(), settings(1)).unwrap();
    run(&mut t, None);
    let json = std::fs::read_to_string(softmax.path().join("config.json")).unwrap();
    assert!(!json.contains("attention"), "{json}");

    let packed = TrainSettings { packed: true, ..settings(1) };
    let err = Trainer::start(&softmax.path().join("p"), model, packed).err().unwrap();
    assert!(matches!(err, TrainError::Setting { field: "packed", .. }), "{err}");
}

#[test]
fn a_checkpoint_translates_like_the_model_that_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Trainer::start(dir.path(), tiny(), settings(15)).unwrap();
    run(&mut t, None);
    let texts = vec!["3 March 2021".to_string(), "Wed 3 Mar 2021".to_string()];
    let a = Translator::load(dir.path()).unwrap().translate(&texts).unwrap();
    let b = Translator::load(dir.path()).unwrap().translate(&texts).unwrap();
    assert_eq!(a, b);
    let aligned = Translator::load(dir.path()).unwrap().translate_aligned(&texts[0]).unwrap();
    assert_eq!(aligned.output, a[0]);
    assert_eq!(aligned.source_tokens.len(), 13, "12 characters and </s>");
    assert_eq!(aligned.layers.len(), 1);
    assert_eq!(aligned.layers[0].len(), 2 * aligned.output_tokens.len() * 13);
    let long = "x".repeat(60);
    let err = Translator::load(dir.path()).unwrap().translate(&[long]).err().unwrap().to_string();
    assert!(err.contains("61 positions") && err.contains("40"), "{err}");
}

#[test]
fn answers_are_refused_with_their_reason_rather_than_invented() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Trainer::start(dir.path(), tiny(), settings(5)).unwrap();
    run(&mut t, None);
    let translator = Translator::load(dir.path()).unwrap();
    assert_eq!(translator.prepare("  3 MARCH 2021 "), Ok("3 March 2021".to_string()));
    assert_eq!(translator.prepare(" "), Err(Unanswered::Empty));
    assert_eq!(translator.prepare("３.3.2021 🙂"), Err(Unanswered::Unknown(vec!['３', '🙂'])));
    assert!(matches!(translator.prepare(&"1".repeat(40)), Err(Unanswered::TooLong { positions: 41, .. })));
    // Five steps teach no dates: each output the model writes is refused as no calendar date.
    let answers = translator.answer(&["3 March 2021", "", "Wed 3 Mar 2021"]).unwrap();
    let raw = translator.translate(&["3 March 2021".into(), "Wed 3 Mar 2021".into()]).unwrap();
    assert_eq!(answers[0], Err(Unanswered::NotADate(raw[0].clone())));
    assert_eq!(answers[1], Err(Unanswered::Empty));
    assert_eq!(answers[2], Err(Unanswered::NotADate(raw[1].clone())));
}

#[test]
fn broken_checkpoints_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Trainer::start(dir.path(), tiny(), settings(15)).unwrap();
    run(&mut t, None);
    let copy = |name: &str| {
        let d = tempfile::tempdir().unwrap();
        for f in ["config.json", "vocab.json", "model.safetensors", "optimizer.safetensors"] {
            std::fs::copy(dir.path().join(f), d.path().join(f)).unwrap();
        }
        (d, name.to_string())
    };
    let err = |d: &Path| Translator::load(d).err().expect("refused").to_string();

    assert!(err(&dir.path().join("nowhere")).contains("no such folder"));
    let (d, f) = copy("model.safetensors");
    std::fs::remove_file(d.path().join(&f)).unwrap();
    assert!(err(d.path()).contains("model.safetensors: missing"));

    let (d, f) = copy("model.safetensors");
    let bytes = std::fs::read(d.path().join(&f)).unwrap();
    std::fs::write(d.path().join(&f), &bytes[..bytes.len() / 2]).unwrap();
    assert!(err(d.path()).contains("truncated"), "{}", err(d.path()));

    // config.json edited after the save: the record in model.safetensors names the field.
    let (d, f) = copy("config.json");
    let text = std::fs::read_to_string(d.path().join(&f)).unwrap().replace("\"d_model\": 16", "\"d_model\": 32");
    std::fs::write(d.path().join(&f), text).unwrap();
    let e = err(d.path());
    assert!(e.contains("config.json has model.d_model 32, the weights were saved with 16"), "{e}");

    // Files from different saves.
    let (d, f) = copy("config.json");
    let text = std::fs::read_to_string(d.path().join(&f)).unwrap().replace("\"step\": 15", "\"step\": 14");
    std::fs::write(d.path().join(&f), text).unwrap();
    let e = err(d.path());
    assert!(e.contains("saved at step 15, but config.json is at step 14: files from different saves"), "{e}");

    // A weight the model does not use (kept with the file's record).
    let (d, f) = copy("model.safetensors");
    let bytes = std::fs::read(d.path().join(&f)).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView)> = file.tensors();
    let extra = [0u8; 8];
    tensors.push((
        "encoder.extra.weight".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &extra).unwrap(),
    ));
    std::fs::write(d.path().join(&f), safetensors::serialize(tensors, header.metadata().clone()).unwrap()).unwrap();
    let e = err(d.path());
    assert!(e.contains("encoder.extra.weight"), "{e}");

    let (d, f) = copy("config.json");
    std::fs::write(d.path().join(&f), "{\"format\": \"something else\"}").unwrap();
    let e = err(d.path());
    assert!(e.contains("format `something else`, expected `attn-translator/2`"), "{e}");
    std::fs::write(d.path().join(&f), "{\"step\": 15}").unwrap();
    let e = err(d.path());
    assert!(e.contains("not a checkpoint manifest: missing field `format`"), "{e}");
}

#[test]
fn a_refused_model_leaves_no_folder_behind() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let bad = ModelConfig { heads: 3, ..tiny() };
    let err = Trainer::start(&out, bad, settings(5)).err().expect("3 heads do not divide 16").to_string();
    assert!(err.contains("heads"), "{err}");
    assert!(!out.exists(), "{} was created for a run that was refused", out.display());
}
