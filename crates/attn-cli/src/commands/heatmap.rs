//! `attn heatmap`: reads attention weights from a safetensors file or `.npz` archive (such as the
//! output of `attn run --weights`), with the file's `mask` marking masked cells when it has one,
//! picks one batch entry and one head (or every head, one panel each), labels the axes with tokens
//! when given, and draws a PNG, SVG or JPEG by the output's extension (any other is refused before
//! the input is read). Every refusal is one line naming the file, the tensor and what was expected
//! versus found.

mod select;

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use attn::heatmap::{draw_head_grid, draw_heatmap, HeatmapStyle};
use attn::picture::PictureFormat;

use crate::io::{check_not_an_input, read_tensors, IoError, IoErrorKind};
use select::{keep_flags, pick, Heads};

/// Arguments of `attn heatmap`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Safetensors file or `.npz` archive holding the weights: `[Lq, Lk]`, `[H, Lq, Lk]` or
    /// `[B, H, Lq, Lk]`, any float type (e.g. the output of `attn run --weights`), and optionally
    /// `mask` (BOOL/U8, true = may attend, broadcastable to the weights, as `attn run --weights`
    /// writes it): its masked cells are drawn hatched grey, apart from weights that are merely 0.
    pub input: PathBuf,
    /// Output picture, in the format its extension names: `.png`, `.svg`, `.jpg` or `.jpeg`.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Name of the tensor to draw. Only `weights` is drawn with the file's `mask` and the axis
    /// titles Query and Key; any other tensor gets Row and Column.
    #[arg(long, default_value = "weights")]
    pub tensor: String,
    /// Batch entry to draw (rank 4 tensors).
    #[arg(long, default_value_t = 0)]
    pub batch: usize,
    /// Head to draw (rank 3 and 4 tensors); default 0.
    #[arg(long, conflicts_with = "all_heads")]
    pub head: Option<usize>,
    /// Draw every head, one panel each, on a shared colour scale.
    #[arg(long)]
    pub all_heads: bool,
    /// Whitespace-separated tokens labelling both axes (needs Lq == Lk).
    #[arg(long, conflicts_with_all = ["query_tokens", "key_tokens"])]
    pub tokens: Option<String>,
    /// Whitespace-separated tokens labelling the query rows, `[Lq]`.
    #[arg(long)]
    pub query_tokens: Option<String>,
    /// Whitespace-separated tokens labelling the key columns, `[Lk]`.
    #[arg(long)]
    pub key_tokens: Option<String>,
    /// Title above the picture (default: the tensor name, batch entry and head).
    #[arg(long)]
    pub title: Option<String>,
}

/// Runs `attn heatmap`.
pub fn main(args: Args) -> Result<()> {
    check_not_an_input(&args.output, [args.input.as_path()])?;
    PictureFormat::from_path(&args.output).map_err(|e| anyhow!("-o {}: {e}", args.output.display()))?;
    let file = args.input.display().to_string();
    let name = args.tensor.as_str();
    let mut tensors = read_tensors(&args.input)?;
    let Some(tensor) = tensors.remove(name) else {
        return Err(missing(&file, name, tensors.keys()).into());
    };
    let weights = name == "weights";
    let mask = tensors.remove("mask").filter(|_| weights);
    let keep = mask.map(|m| keep_flags(&file, m, &tensor.shape)).transpose()?;
    let heads = if args.all_heads { Heads::All } else { Heads::One(args.head.unwrap_or(0)) };
    let picked = pick(&file, name, &tensor, keep.as_deref(), args.batch, heads)?;
    let (query_labels, key_labels) =
        labels(&args, picked.lq, picked.lk).map_err(|kind| IoError::tensor(&file, name, kind))?;
    let place = if picked.place.is_empty() { String::new() } else { format!(", {}", picked.place) };
    let style = HeatmapStyle {
        title: Some(args.title.clone().unwrap_or_else(|| format!("{name}{place}"))),
        query_labels,
        key_labels,
        row_title: (!weights).then(|| "Row".into()),
        column_title: (!weights).then(|| "Column".into()),
    };
    let keep = picked.keep.as_deref();
    if args.all_heads {
        draw_head_grid(&args.output, &picked.data, keep, picked.heads, picked.lq, picked.lk, &style)?;
    } else {
        draw_heatmap(&args.output, &picked.data, keep, picked.lq, picked.lk, &style)?;
    }
    println!("heatmap of {file} tensor '{name}' {:?}{place} written to {}", tensor.shape, args.output.display());
    Ok(())
}

/// The error for tensor `name` absent from `file`, listing the tensors `present`.
fn missing<'a>(file: &str, name: &str, present: impl Iterator<Item = &'a String>) -> IoError {
    let present: Vec<&str> = present.map(String::as_str).collect();
    let mut found = if present.is_empty() { "no tensors".to_string() } else { present.join(", ") };
    if !present.is_empty() {
        found.push_str("; pick one with --tensor");
    }
    if name == "weights" {
        found.push_str(" (`attn run` writes 'weights' only with --weights)");
    }
    IoError::tensor(file, name, IoErrorKind::Missing { found })
}

/// The labels of one axis, when tokens were given for it.
type AxisLabels = Option<Vec<String>>;

/// Query and key labels from `--tokens` or `--query-tokens`/`--key-tokens`, checked against the
/// matrix size `[lq, lk]`.
fn labels(args: &Args, lq: usize, lk: usize) -> Result<(AxisLabels, AxisLabels), IoErrorKind> {
    let split = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let counted = |flag: &str, tokens: &Option<String>, dim: &str, n: usize| {
        tokens
            .as_deref()
            .map(|s| {
                let tokens = split(s);
                if tokens.len() == n {
                    Ok(tokens)
                } else {
                    Err(IoErrorKind::Value(format!("{flag} has {} tokens, expected {dim} = {n}", tokens.len())))
                }
            })
            .transpose()
    };
    match &args.tokens {
        Some(_) if lq != lk => Err(IoErrorKind::Value(format!(
            "--tokens labels both axes but Lq = {lq} differs from Lk = {lk}; use --query-tokens and --key-tokens"
        ))),
        Some(_) => {
            let both = counted("--tokens", &args.tokens, "Lq = Lk", lq)?;
            Ok((both.clone(), both))
        }
        None => Ok((
            counted("--query-tokens", &args.query_tokens, "Lq", lq)?,
            counted("--key-tokens", &args.key_tokens, "Lk", lk)?,
        )),
    }
}
