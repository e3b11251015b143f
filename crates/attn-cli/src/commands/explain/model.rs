//! `attn explain model --model M`: what a real model's heads do. Every layer's attention on a
//! text drawn as a grid of heads with the real tokens on the axes (seed 003's
//! `visualize_all_heads`, for a pretrained model); the sink, previous-token and induction score
//! of every head (`attn_models::heads`) drawn as layer × head maps, written to `heads.json` and
//! summarised by the top heads of each kind.

use std::path::Path;

use attn::heatmap::{draw_head_grid, draw_heatmap, HeatmapStyle};
use attn_models::heads::{induction_ids, AttentionWeights, HeadMap, HeadScores};
use attn_models::{Decoder, SentenceEncoder, TextTokenizer};
use candle_core::DType;

use crate::commands::models::ModelArg;
use crate::commands::out_dir::OutDir;
use crate::commands::threads::Threads;

/// Arguments of `attn explain model`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArg,
    /// The text whose attention is drawn and scored for sinks and previous tokens.
    #[arg(long, default_value = "The cat sat on the mat because the mat was warm, and the cat was tired.")]
    pub text: String,
    /// Random tokens (repeated twice) of the induction score.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(2..=1000))]
    pub repeat_len: u64,
    /// Seed of the induction score's random tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the scores as JSON (as heads.json) instead of the summary.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub out: OutDir,
    #[command(flatten)]
    pub threads: Threads,
}

/// A loaded model: encoder directory or decoder GGUF.
enum Loaded {
    Encoder(SentenceEncoder),
    Decoder(Decoder),
}

impl Loaded {
    fn open(path: &Path) -> anyhow::Result<Self> {
        Ok(if attn_models::is_encoder_dir(path) {
            Self::Encoder(SentenceEncoder::load(path)?)
        } else {
            Self::Decoder(Decoder::open(path)?)
        })
    }

    fn parts(&self) -> (&dyn AttentionWeights, &TextTokenizer) {
        match self {
            Self::Encoder(e) => (&e.bert, &e.tokenizer),
            Self::Decoder(d) => (&d.model, &d.tokenizer),
        }
    }
}

/// Runs `attn explain model`.
pub fn main(args: Args) -> anyhow::Result<()> {
    let path = args.model.path()?;
    let dir = args.out.prepare()?.to_path_buf();
    let loaded = Loaded::open(&path)?;
    let (model, tokenizer) = loaded.parts();
    let text_ids = tokenizer.encode(&args.text)?;
    let repeated = induction_ids(args.repeat_len as usize, args.seed);
    let (scores, weights) = args
        .threads
        .pool()?
        .install(|| -> anyhow::Result<_> { Ok(HeadScores::measure(model, &text_ids, &repeated)?) })?;
    let (layers, heads) = (scores.sink.len(), scores.sink.first().map_or(0, Vec::len));
    let tokens: Vec<String> = text_ids.iter().map(|&id| printable(&tokenizer.token(id))).collect();
    let mut written = Vec::new();
    for (layer, w) in weights.iter().enumerate() {
        let file = dir.join(format!("layer{:02}.png", layer + 1));
        let style = HeatmapStyle {
            title: Some(format!("{}: layer {} of {layers}, {:?}", name(&path), layer + 1, args.text)),
            query_labels: Some(tokens.clone()),
            key_labels: Some(tokens.clone()),
            ..Default::default()
        };
        let values: Vec<f32> = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let l = tokens.len();
        draw_head_grid(&file, &values, None, heads, l, l, &style)?;
        written.push(file);
    }
    let kinds: [(&str, &HeadMap, &str); 3] = [
        ("sink", &scores.sink, "mean weight on position 0"),
        ("previous", &scores.previous, "mean weight on the previous token"),
        ("induction", &scores.induction, "mean weight on the token after the earlier copy"),
    ];
    for (kind, map, what) in kinds {
        let file = dir.join(format!("heads-{kind}.png"));
        let style = HeatmapStyle {
            title: Some(format!("{}: {kind} score per head ({what})", name(&path))),
            query_labels: Some((1..=layers).map(|l| l.to_string()).collect()),
            key_labels: Some((0..heads).map(|h| h.to_string()).collect()),
            row_title: Some("layer".into()),
            column_title: Some("head".into()),
        };
        let values: Vec<f32> = map.iter().flatten().map(|&x| x as f32).collect();
        draw_heatmap(&file, &values, None, layers, heads, &style)?;
        written.push(file);
    }
    let json = serde_json::json!({
        "layers": layers,
        "heads": heads,
        "text_ids": text_ids,
        "induction_ids": repeated,
        "sink": scores.sink,
        "previous": scores.previous,
        "induction": scores.induction,
    });
    let json_file = dir.join("heads.json");
    attn::write_file::write_atomically(&json_file, |w| w.write_all(json.to_string().as_bytes()))?;
    if args.json {
        println!("{json}");
        return Ok(());
    }
    println!(
        "{}: {layers} layers × {heads} heads; text of {} tokens; induction on {} random tokens twice (seed {})",
        name(&path),
        text_ids.len(),
        args.repeat_len,
        args.seed
    );
    for (kind, map, what) in kinds {
        let top =
            top_heads(map, 3).iter().map(|(l, h, s)| format!("layer {} head {h}: {s:.3}", l + 1)).collect::<Vec<_>>();
        println!("{kind:<9} ({what}): {}", top.join(", "));
    }
    written.push(json_file);
    for file in written {
        println!("wrote {}", file.display());
    }
    Ok(())
}

/// The `n` highest-scoring `(layer, head, score)`, best first.
fn top_heads(map: &HeadMap, n: usize) -> Vec<(usize, usize, f64)> {
    let mut all: Vec<(usize, usize, f64)> =
        map.iter().enumerate().flat_map(|(l, row)| row.iter().enumerate().map(move |(h, &s)| (l, h, s))).collect();
    all.sort_by(|a, b| b.2.total_cmp(&a.2));
    all.truncate(n);
    all
}

/// A token as a label: byte-level BPE's space (`Ġ`) and newline (`Ċ`) spelled visibly.
fn printable(token: &str) -> String {
    token.replace('Ġ', "·").replace('Ċ', "\\n").replace('▁', "·")
}

fn name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
