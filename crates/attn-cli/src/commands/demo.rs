//! `attn demo`.

/// Arguments of `attn demo`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `attn demo`.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("attn demo is not implemented yet")
}
