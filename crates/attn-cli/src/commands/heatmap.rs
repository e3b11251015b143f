//! `attn heatmap`.

/// Arguments of `attn heatmap`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `attn heatmap`.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("attn heatmap is not implemented yet")
}
