//! `attn run`.

/// Arguments of `attn run`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs `attn run`.
pub fn main(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("attn run is not implemented yet")
}
