//! `attn translate`: greedy translations by a checkpoint of `attn train`, for texts given as
//! arguments or, without any, one per line of standard input. Each text gets one line on standard
//! output: its answer, or an empty line when it has none, said on stderr with its number and its
//! text cut short (`line 3: not translated: …`): an empty text (skipped), a line that is not
//! UTF-8, too long for the model, holding characters outside the vocabulary, or for the dates task
//! an output that is no calendar date. The other texts still get their answers; the exit status is
//! 1 if any text went unanswered. `--heatmap` draws the first answered text's cross-attention,
//! every head of every decoder layer in a grid plus the head average (`FILE.png` →
//! `FILE-layer1.png`, … and `FILE-average.png`).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use attn::heatmap::{draw_head_grid, draw_heatmap, HeatmapStyle};
use attn::picture::PictureFormat;
use attn_train::translate::{excerpt, Aligned, Answer, Translator, Unanswered};

/// Arguments of `attn translate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The folder `attn train --out` wrote.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Draw the first answered text's cross-attention, in the format the extension names: `.png`,
    /// `.svg`, `.jpg` or `.jpeg` (checked before the checkpoint is loaded). Writes one file per
    /// decoder layer and one averaged: `a.png` gives `a-layer1.png`, `a-layer2.png`, …,
    /// `a-average.png`.
    #[arg(long, value_name = "FILE.png")]
    pub heatmap: Option<PathBuf>,
    /// Texts to translate (default: one per line of standard input). Each gets one output line,
    /// empty when it cannot be answered (the reason goes to stderr).
    pub texts: Vec<String>,
}

/// One text as read: UTF-8, or the lossy text of a line that is not, with the 1-based byte where
/// decoding failed.
type Input = Result<String, (String, usize)>;

pub fn main(args: Args) -> anyhow::Result<()> {
    if let Some(path) = &args.heatmap {
        PictureFormat::from_path(path).map_err(|e| anyhow!("--heatmap {}: {e}", path.display()))?;
    }
    let translator = Translator::load(&args.checkpoint)?;
    let (label, inputs) = if args.texts.is_empty() {
        let mut bytes = Vec::new();
        std::io::stdin().lock().read_to_end(&mut bytes).context("cannot read standard input")?;
        ("line", lines(&bytes))
    } else {
        ("text", args.texts.into_iter().map(Ok).collect())
    };
    let texts: Vec<&str> = inputs.iter().filter_map(|i| i.as_deref().ok()).collect();
    let mut answers = translator.answer(&texts)?.into_iter();
    let (mut failed, mut first): (usize, Option<Answer>) = (0, None);
    for (i, input) in inputs.iter().enumerate() {
        let said = match input {
            Ok(text) => match answers.next().expect("one answer per UTF-8 text") {
                Ok(answer) => {
                    println!("{}", answer.output);
                    first.get_or_insert(answer);
                    continue;
                }
                Err(Unanswered::Empty) => "empty, skipped".to_string(),
                Err(reason) => {
                    failed += 1;
                    format!("not translated: {reason}: {}", excerpt(text))
                }
            },
            Err((lossy, byte)) => {
                failed += 1;
                format!("not translated: not valid UTF-8 (at byte {byte} of the line): {}", excerpt(lossy))
            }
        };
        println!();
        eprintln!("{label} {}: {said}", i + 1);
    }
    match (&args.heatmap, &first) {
        (Some(path), Some(first)) => {
            let aligned = translator.translate_aligned(&first.source)?;
            for written in draw_alignment(path, &first.source, &aligned)? {
                eprintln!("wrote {}", written.display());
            }
        }
        (Some(path), None) => eprintln!("--heatmap {}: no {label} was answered, nothing drawn", path.display()),
        (None, _) => {}
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} {label}s could not be translated (each is named above)", inputs.len());
    }
    Ok(())
}

/// The lines of `bytes` (standard input): split at `\n`, a `\r` before it and a leading
/// byte-order mark dropped, no line after a final `\n`.
fn lines(bytes: &[u8]) -> Vec<Input> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .strip_suffix(b"\n")
        .unwrap_or(bytes)
        .split(|&b| b == b'\n')
        .map(|line| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            String::from_utf8(line.to_vec())
                .map_err(|e| (String::from_utf8_lossy(line).into_owned(), e.utf8_error().valid_up_to() + 1))
        })
        .collect()
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
