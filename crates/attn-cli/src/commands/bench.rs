//! `attn bench`.

/// Arguments of `attn bench`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `attn bench`.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("attn bench is not implemented yet")
}
