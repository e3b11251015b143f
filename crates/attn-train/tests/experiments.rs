//! The `attn explain` experiments that need a trained model: the heads of a tiny translator
//! trained for a few steps (statistics in range, bounded by uniform attention, example weights
//! that are distributions over the allowed keys), and the self-attention classifier learning its
//! task in a short run.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use attn_train::checkpoint::Evaluation;
use attn_train::experiments::classify::{self, ClassifySettings};
use attn_train::experiments::heads::{self, AttentionKind, HeadsSettings};
use attn_train::model::ModelConfig;
use attn_train::settings::{TaskSpec, TrainSettings};
use attn_train::trainer::{Observer, StepReport, Trainer};
use attn_train::translate::Translator;

struct Quiet;

impl Observer for Quiet {
    fn started(&mut self, _done: u64, _total: u64) {}
    fn step(&mut self, _report: &StepReport) {}
    fn evaluated(&mut self, _evaluation: &Evaluation) {}
    fn saved(&mut self, _done: u64, _dir: &Path) {}
}

/// A 2-layer, 2-head translator trained for a few steps in `dir`.
fn trained(dir: &Path) -> Translator {
    let model =
        ModelConfig { d_model: 16, heads: 2, layers: 2, ff: 32, dropout: 0.1, max_len: 40, ..ModelConfig::default() };
    let settings = TrainSettings {
        task: TaskSpec::Dates,
        steps: 10,
        batch: 16,
        lr: 3e-3,
        warmup: 5,
        clip: 1.0,
        weight_decay: 0.01,
        seed: 1,
        held_out: Some(30),
        eval_every: 10,
        checkpoint_every: 10,
        packed: false,
    };
    Trainer::start(dir, model, settings).unwrap().run(&mut Quiet, &AtomicBool::new(false)).unwrap();
    Translator::load(dir).unwrap()
}

#[test]
fn head_statistics_are_in_range_and_bounded_by_uniform_attention() {
    let dir = tempfile::tempdir().unwrap();
    let translator = trained(dir.path());
    let sample = heads::sample(&translator, &HeadsSettings { samples: 100, example: 3 }).unwrap();
    assert_eq!(sample.pairs.len(), 30, "only 30 pairs are held out");
    let report = heads::run(&translator, &sample).unwrap();
    assert_eq!((report.samples, report.heads, report.rows.len()), (30, 2, 3 * 2 * 2));
    let uniform = |kind| report.uniform.iter().find(|(k, _)| *k == kind).unwrap().1;
    for row in &report.rows {
        let u = uniform(row.kind);
        assert!(row.stats.entropy >= 0.0 && row.stats.entropy <= u.entropy + 1e-4, "{row:?} vs uniform {u:?}");
        assert_eq!(row.stats.distance.is_some(), row.kind.is_self(), "{row:?}");
        if let Some(d) = row.stats.distance {
            assert!((0.0..40.0).contains(&d), "{row:?}");
        }
    }
    // Uniform attention over a causal row 0..=i is at distance i/2 on average: well below the
    // encoder's, whose rows see the whole source.
    let (enc, dec) = (uniform(AttentionKind::EncoderSelf), uniform(AttentionKind::DecoderSelf));
    assert!(dec.distance.unwrap() < enc.distance.unwrap(), "{enc:?} {dec:?}");

    let (source, target) = &report.example;
    assert_eq!(report.example, sample.pairs[3]);
    assert_eq!(report.grids.len(), 3 * 2);
    for grid in &report.grids {
        let (lq, lk) = (grid.query_tokens.len(), grid.key_tokens.len());
        let src_len = source.chars().count() + 1;
        let tgt_len = target.chars().count() + 1;
        let expected = match grid.kind {
            AttentionKind::EncoderSelf => (src_len, src_len),
            AttentionKind::DecoderSelf => (tgt_len, tgt_len),
            AttentionKind::Cross => (tgt_len, src_len),
        };
        assert_eq!((lq, lk), expected, "{:?}", grid.kind);
        assert_eq!(grid.weights.len(), 2 * lq * lk);
        assert_eq!(grid.keep.len(), grid.weights.len());
        for (r, (row, keep)) in grid.weights.chunks(lk).zip(grid.keep.chunks(lk)).enumerate() {
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-4, "{:?} row {r} sums to {sum}", grid.kind);
            // The example has no padding: only the decoder's causal mask hides keys.
            let causal = grid.kind == AttentionKind::DecoderSelf;
            assert!(keep.iter().enumerate().all(|(j, &k)| k == (!causal || j <= r % lq)), "{:?} row {r}", grid.kind);
            assert!(row.iter().zip(keep).all(|(&w, &k)| k || w == 0.0), "masked weights of row {r}: {row:?}");
        }
    }
    assert_eq!(report.grids[0].key_tokens.last().unwrap(), "</s>");
    assert_eq!(report.grids[2].query_tokens[0], "<s>");
}

#[test]
fn head_settings_are_checked_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let translator = trained(dir.path());
    let err =
        |samples, example| heads::sample(&translator, &HeadsSettings { samples, example }).unwrap_err().to_string();
    assert!(err(0, 0).starts_with("samples"));
    let e = err(10, 10);
    assert!(e.starts_with("example") && e.contains("10 pairs"), "{e}");
}

#[test]
fn the_classifier_learns_which_marker_comes_first() {
    let s = ClassifySettings { train_size: 1000, test_size: 300, steps: 250, eval_every: 125, ..Default::default() };
    let mut seen = Vec::new();
    let report = classify::run(&s, |e| seen.push(e.step)).unwrap();
    assert_eq!(seen, [125, 250]);
    let last = report.evaluations.last().unwrap();
    assert!(last.test_accuracy > 0.85 && last.train_accuracy > 0.85, "{last:?}");
    assert!(last.loss < report.evaluations[0].loss, "{:?}", report.evaluations);
    let a = &report.attended;
    let l = a.example.tokens.len();
    assert_eq!(a.weights.len(), l * l);
    assert!(a.weights.chunks(l).all(|row| (row.iter().sum::<f32>() - 1.0).abs() < 1e-4));
    // Same settings, same run.
    assert_eq!(classify::run(&s, |_| {}).unwrap().evaluations, report.evaluations);
}

#[test]
fn classifier_settings_are_checked_by_field() {
    let err = |s: ClassifySettings| classify::run(&s, |_| {}).unwrap_err().to_string();
    let d = ClassifySettings::default();
    assert!(err(ClassifySettings { min_len: 1, ..d }).starts_with("min_len"));
    assert!(err(ClassifySettings { max_len: 3, ..d }).starts_with("max_len"));
    assert!(err(ClassifySettings { lr: f64::NAN, ..d }).starts_with("lr"));
    assert!(err(ClassifySettings { batch: 0, ..d }).starts_with("batch"));
    assert!(err(ClassifySettings { test_size: 0, ..d }).starts_with("test_size"));
    assert!(err(ClassifySettings { steps: 0, ..d }).starts_with("steps"));
    assert!(err(ClassifySettings { eval_every: 0, ..d }).starts_with("eval_every"));
}
