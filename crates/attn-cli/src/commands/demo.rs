//! `attn demo`: worked examples on built-in data, each computed through the `attn` library:
//! 1. the classic three-token self-attention walk-through (keys, queries, values, scores, softmax
//!    weights and outputs), once unscaled and once scaled by `1/√d_k`;
//! 2. a padded batch with a padding mask built from token ids, showing shapes and zero weights on
//!    the padded keys;
//! 3. heatmap PNGs of example 1's scaled weights and of example 2's first batch entry, whose
//!    padded keys are drawn as masked (hatched grey), not as weights of 0.

use super::out_dir::OutDir;

use anyhow::Context;
use attn::heatmap::{draw_heatmap, draw_tensor, HeatmapStyle};
use attn::{padding_mask, random::uniform, sdpa_full, Mask, SdpaOptions};
use candle_core::{Device, Tensor};

/// Arguments of `attn demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub out: OutDir,
}

/// Runs `attn demo`: prints the worked examples and writes `attn-demo-heatmap.png` and
/// `attn-demo-padded.png`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let dir = args.out.prepare()?;
    let weights = worked_example()?;
    println!();
    let padded = padded_batch()?;
    println!();
    write_heatmaps(&weights, &padded, dir)
}

const TOKENS: [&str; 3] = ["x1", "x2", "x3"];

/// Example 1; returns the scaled weights `[3, 3]` for the heatmap.
fn worked_example() -> anyhow::Result<Vec<f32>> {
    let cpu = &Device::Cpu;
    let x = Tensor::new(&[[1f32, 0., 1., 0.], [0., 2., 0., 2.], [1., 1., 1., 1.]], cpu)?;
    let w_k = Tensor::new(&[[0f32, 0., 1.], [1., 1., 0.], [0., 1., 0.], [1., 1., 0.]], cpu)?;
    let w_q = Tensor::new(&[[1f32, 0., 1.], [1., 0., 0.], [0., 0., 1.], [0., 1., 1.]], cpu)?;
    let w_v = Tensor::new(&[[0f32, 2., 0.], [0., 3., 0.], [1., 0., 3.], [1., 1., 0.]], cpu)?;
    println!("== 1. Self-attention step by step: 3 tokens, d_model = 4, d_k = d_v = 3 ==");
    print_matrix("inputs x [3, 4]", &x, &TOKENS, &[])?;
    print_matrix("W_K [4, 3]", &w_k, &[], &[])?;
    print_matrix("W_Q [4, 3]", &w_q, &[], &[])?;
    print_matrix("W_V [4, 3]", &w_v, &[], &[])?;
    let (keys, queries, values) = (x.matmul(&w_k)?, x.matmul(&w_q)?, x.matmul(&w_v)?);
    print_matrix("keys K = x·W_K", &keys, &TOKENS, &[])?;
    print_matrix("queries Q = x·W_Q", &queries, &TOKENS, &[])?;
    print_matrix("values V = x·W_V", &values, &TOKENS, &[])?;
    let scores = queries.matmul(&keys.t()?)?;
    print_matrix("raw scores Q·Kᵀ (row = query, column = key)", &scores, &TOKENS, &TOKENS)?;

    let d_k = keys.dims()[1] as f64;
    let mut scaled_weights = Vec::new();
    for (scale, name) in
        [(1.0, "scale = 1 (the classic illustrated walk-through)"), (1.0 / d_k.sqrt(), "scale = 1/√d_k = 1/√3")]
    {
        println!("-- {name} --");
        let opts = SdpaOptions::default().scale(scale).return_weights(true);
        let (q, k, v) = (queries.unsqueeze(0)?, keys.unsqueeze(0)?, values.unsqueeze(0)?);
        let res = sdpa_full(&q, &k, &v, &opts)?;
        let weights = res.weights.context("sdpa_full returned no weights")?.squeeze(0)?;
        print_matrix("weights softmax(Q·Kᵀ·scale)", &weights, &TOKENS, &TOKENS)?;
        print_matrix("outputs weights·V", &res.out.squeeze(0)?, &TOKENS, &[])?;
        scaled_weights = weights.flatten_all()?.to_vec1::<f32>()?;
    }
    Ok(scaled_weights)
}

/// Example 2's first batch entry, for its heatmap.
struct Padded {
    /// Weights `[H, Lq, Lk]`.
    weights: Tensor,
    /// The padding mask `[1, 1, Lk]`.
    mask: Mask,
    /// The key token ids, as labels.
    keys: Vec<String>,
}

/// Example 2: a padded batch through a padding mask.
fn padded_batch() -> anyhow::Result<Padded> {
    let (b, h, lq, lk, d_k, d_v) = (2, 2, 5, 7, 64, 128);
    println!("== 2. A padded batch: B = {b}, H = {h}, Lq = {lq}, Lk = {lk}, d_k = {d_k}, d_v = {d_v} ==");
    let pad_id = 0u32;
    let tokens = Tensor::new(&[[11u32, 23, 5, 42, 17, 0, 0], [8, 3, 29, 14, 6, 0, 0]], &Device::Cpu)?;
    println!("key token ids (pad id {pad_id}): {:?}", tokens.to_vec2::<u32>()?);
    let q = uniform(&[b, h, lq, d_k], -1.0, 1.0, 1)?;
    let k = uniform(&[b, h, lk, d_k], -1.0, 1.0, 2)?;
    let v = uniform(&[b, h, lk, d_v], -1.0, 1.0, 3)?;
    let mask = padding_mask(&tokens, pad_id)?;
    let res = sdpa_full(&q, &k, &v, &SdpaOptions::default().mask(mask.clone()).return_weights(true))?;
    let weights = res.weights.context("sdpa_full returned no weights")?;
    for (name, dims) in [
        ("q", q.dims()),
        ("k", k.dims()),
        ("v", v.dims()),
        ("mask", mask.shape()),
        ("out", res.out.dims()),
        ("lse", res.lse.dims()),
        ("weights", weights.dims()),
    ] {
        println!("  {name:<8}{dims:?}");
    }
    let first = weights.get(0)?.get(0)?.get(0)?;
    println!("weights of batch 0, head 0, query 0 (keys 6 and 7 are padding):");
    print_row("", &first.to_vec1::<f32>()?);
    println!("  row sum = {:.4}", first.sum_all()?.to_scalar::<f32>()?);
    let key_ids = tokens.get(0)?.to_vec1::<u32>()?;
    let keys = key_ids.iter().map(|&t| if t == pad_id { "<pad>".to_string() } else { t.to_string() }).collect();
    Ok(Padded { weights: weights.get(0)?, mask: Mask::keep(mask.tensor().get(0)?), keys })
}

/// Step 3: the heatmaps of example 1's scaled weights and of example 2's first batch entry.
fn write_heatmaps(weights: &[f32], padded: &Padded, dir: &std::path::Path) -> anyhow::Result<()> {
    println!("== 3. Heatmaps of example 1's weights (scale 1/√3) and of example 2's batch entry 0 ==");
    let path = dir.join("attn-demo-heatmap.png");
    let labels: Vec<String> = TOKENS.iter().map(|s| s.to_string()).collect();
    let style = HeatmapStyle {
        title: Some("softmax(Q·Kᵀ/√3), worked example".into()),
        query_labels: Some(labels.clone()),
        key_labels: Some(labels),
        ..Default::default()
    };
    draw_heatmap(&path, weights, None, TOKENS.len(), TOKENS.len(), &style)?;
    println!("heatmap written to {}", path.display());
    let path = dir.join("attn-demo-padded.png");
    let style = HeatmapStyle {
        title: Some("padded batch, entry 0: the padded keys are masked".into()),
        key_labels: Some(padded.keys.clone()),
        ..Default::default()
    };
    draw_tensor(&path, &padded.weights, Some(&padded.mask), &style)?;
    println!("heatmap with the padded keys masked written to {}", path.display());
    Ok(())
}

/// Prints a 2-D tensor under `title`, one row per line with 4 decimals, each row prefixed by its
/// entry of `rows`; `columns`, when not empty, is printed as a header line.
fn print_matrix(title: &str, t: &Tensor, rows: &[&str], columns: &[&str]) -> anyhow::Result<()> {
    println!("{title}:");
    if !columns.is_empty() {
        let header: String = columns.iter().map(|c| format!("{c:>10}")).collect();
        println!("      {header}");
    }
    for (i, row) in t.to_vec2::<f32>()?.iter().enumerate() {
        print_row(rows.get(i).copied().unwrap_or(""), row);
    }
    Ok(())
}

fn print_row(label: &str, row: &[f32]) {
    let cells: String = row.iter().map(|x| format!("{x:>10.4}")).collect();
    println!("  {label:<4}{cells}");
}
