//! `attn translate`: greedy translations by a checkpoint of `attn train`, one output a line, for
//! texts given as arguments or, without any, one per line of standard input; `--heatmap` draws the
//! first text's cross-attention, every head of every decoder layer in a grid plus the head average
//! (`FILE.png` → `FILE-layer1.png`, … and `FILE-average.png`).

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use attn::heatmap::{draw_head_grid, draw_heatmap, HeatmapStyle};
use attn::picture::PictureFormat;
use attn_train::translate::{Aligned, Translator};

/// Arguments of `attn translate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The folder `attn train --out` wrote.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Draw the first text's cross-attention, in the format the extension names: `.png`, `.svg`,
    /// `.jpg` or `.jpeg` (checked before the checkpoint is loaded).
    #[arg(long, value_name = "FILE.png")]
    pub heatmap: Option<PathBuf>,
    /// Texts to translate (default: one per line of standard input).
    pub texts: Vec<String>,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if let Some(path) = &args.heatmap {
        PictureFormat::from_path(path).map_err(|e| anyhow!("--heatmap {}: {e}", path.display()))?;
    }
    let translator = Translator::load(&args.checkpoint)?;
    let texts = if args.texts.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<Vec<_>, _>>().context("cannot read standard input")?
    } else {
        args.texts
    };
    for output in translator.translate(&texts)? {
        println!("{output}");
    }
    if let (Some(path), Some(first)) = (&args.heatmap, texts.first()) {
        let aligned = translator.translate_aligned(first)?;
        for written in draw_alignment(path, first, &aligned)? {
            eprintln!("wrote {}", written.display());
        }
    }
    Ok(())
}

/// `FILE-<suffix>.<ext>` next to `path` (whose picture extension has been checked).
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "attention".into(), |s| s.to_string_lossy().into_owned());
    let ext = path.extension().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!("{stem}-{suffix}.{ext}"))
}

/// Writes one grid per layer and the average over heads and layers; returns the files.
fn draw_alignment(path: &Path, text: &str, a: &Aligned) -> anyhow::Result<Vec<PathBuf>> {
    let (lt, ls) = (a.output_tokens.len(), a.source_tokens.len());
    if lt == 0 {
        anyhow::bail!("--heatmap: the model produced no output for {text:?}, nothing to draw");
    }
    let style = |title: String| HeatmapStyle {
        title: Some(title),
        query_labels: Some(a.output_tokens.clone()),
        key_labels: Some(a.source_tokens.clone()),
        ..Default::default()
    };
    let mut written = Vec::new();
    let mut average = vec![0f32; lt * ls];
    for (l, weights) in a.layers.iter().enumerate() {
        let file = sibling(path, &format!("layer{}", l + 1));
        draw_head_grid(
            &file,
            weights,
            None,
            a.heads,
            lt,
            ls,
            &style(format!("cross-attention, decoder layer {}: {text:?} → {:?}", l + 1, a.output)),
        )?;
        written.push(file);
        for head in weights.chunks(lt * ls) {
            for (acc, w) in average.iter_mut().zip(head) {
                *acc += w / (a.heads * a.layers.len()) as f32;
            }
        }
    }
    let file = sibling(path, "average");
    draw_heatmap(
        &file,
        &average,
        None,
        lt,
        ls,
        &style(format!("cross-attention averaged over heads and layers: {text:?} → {:?}", a.output)),
    )?;
    written.push(file);
    Ok(written)
}
