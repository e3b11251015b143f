//! `attn explain classify`: trains a single-head self-attention classifier with padding masks on
//! generated sequences of varying length — which of two markers comes first
//! (`attn_train::experiments::classify`) — printing loss and train/test accuracy as it goes, then
//! drawing the accuracy curves and what the trained head attends to on a test sequence.

use attn::chart::{draw_lines, LineChart, Series};
use attn::heatmap::{draw_heatmap, HeatmapStyle};
use attn_train::experiments::classify::{self, ClassifySettings, Evaluation};

use crate::commands::out_dir::OutDir;
use crate::commands::with_flag;

/// Arguments of `attn explain classify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Optimiser steps.
    #[arg(long, default_value_t = ClassifySettings::default().steps)]
    pub steps: u64,
    /// Sequences per step.
    #[arg(long, default_value_t = ClassifySettings::default().batch)]
    pub batch: usize,
    /// Peak learning rate (AdamW, warm-up then cosine decay).
    #[arg(long, default_value_t = ClassifySettings::default().lr)]
    pub lr: f64,
    /// Embedding and attention width.
    #[arg(long, default_value_t = ClassifySettings::default().d_model)]
    pub d_model: usize,
    /// Training sequences.
    #[arg(long, default_value_t = ClassifySettings::default().train_size)]
    pub train_size: usize,
    /// Test sequences (never trained on).
    #[arg(long, default_value_t = ClassifySettings::default().test_size)]
    pub test_size: usize,
    /// Shortest sequence, both markers included.
    #[arg(long, default_value_t = ClassifySettings::default().min_len)]
    pub min_len: usize,
    /// Longest sequence.
    #[arg(long, default_value_t = ClassifySettings::default().max_len)]
    pub max_len: usize,
    /// Steps between evaluations.
    #[arg(long, default_value_t = ClassifySettings::default().eval_every)]
    pub eval_every: u64,
    /// Seed of the data, initialisation and batch order.
    #[arg(long, default_value_t = ClassifySettings::default().seed)]
    pub seed: u64,
    #[command(flatten)]
    pub out: OutDir,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let settings = ClassifySettings {
        train_size: args.train_size,
        test_size: args.test_size,
        min_len: args.min_len,
        max_len: args.max_len,
        d_model: args.d_model,
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        eval_every: args.eval_every,
        seed: args.seed,
    };
    settings.check().map_err(with_flag::<Args>)?;
    let dir = args.out.prepare()?;
    println!(
        "which of A and B comes first: {} training and {} test sequences of {}..={} tokens, padded; \
         one attention head, d = {}",
        settings.train_size, settings.test_size, settings.min_len, settings.max_len, settings.d_model
    );
    println!("{:>6} {:>10} {:>10} {:>10}", "step", "loss", "train %", "test %");
    let report = classify::run(&settings, |e: &Evaluation| {
        println!("{:>6} {:>10.4} {:>10.1} {:>10.1}", e.step, e.loss, 100.0 * e.train_accuracy, 100.0 * e.test_accuracy);
    })?;
    if let Some(last) = report.evaluations.last() {
        println!(
            "train accuracy {:.1}%, test accuracy {:.1}% (chance 50%)",
            100.0 * last.train_accuracy,
            100.0 * last.test_accuracy
        );
    }
    let curves = dir.join("classify-accuracy.png");
    let series = |name: &str, f: fn(&Evaluation) -> f64| Series {
        name: name.into(),
        points: report.evaluations.iter().map(|e| (e.step as f64, 100.0 * f(e))).collect(),
    };
    draw_lines(
        &curves,
        &LineChart {
            title: "self-attention classifier: which marker comes first".into(),
            x_label: "step".into(),
            y_label: "% correct".into(),
            log_x: false,
            log_y: false,
            series: vec![series("train", |e| e.train_accuracy), series("test", |e| e.test_accuracy)],
        },
    )?;
    let a = &report.attended;
    let tokens: Vec<String> = a.example.tokens.iter().map(|&t| classify::token_text(t)).collect();
    let class = |c: u32| classify::CLASSES[c as usize];
    let attention = dir.join("classify-attention.png");
    let title = format!("attention on test sequence 0 ({}, predicted {})", class(a.example.label), class(a.predicted));
    let style = HeatmapStyle {
        title: Some(title),
        query_labels: Some(tokens.clone()),
        key_labels: Some(tokens),
        ..Default::default()
    };
    draw_heatmap(&attention, &a.weights, None, a.example.tokens.len(), a.example.tokens.len(), &style)?;
    println!("wrote {} and {}", curves.display(), attention.display());
    Ok(())
}
