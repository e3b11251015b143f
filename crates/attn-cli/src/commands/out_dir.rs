//! The `--out-dir` flag of the commands that write pictures and models: the folder is created if
//! missing and proved writable before any work starts, so a long run never fails at its end.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Where a command writes its files.
#[derive(clap::Args, Debug, Clone)]
pub struct OutDir {
    /// Folder for the files written (created if missing, checked before any work); default: the
    /// current folder.
    #[arg(long, default_value = ".")]
    pub out_dir: PathBuf,
}

impl OutDir {
    /// Creates the folder and proves it writable with a probe file (removed again); returns it.
    pub fn prepare(&self) -> anyhow::Result<&Path> {
        let dir = &self.out_dir;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--out-dir {}: cannot create the folder", dir.display()))?;
        let probe = dir.join(format!(".attn-write-check-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .with_context(|| format!("--out-dir {}: cannot write in the folder", dir.display()))?;
        std::fs::remove_file(&probe).with_context(|| {
            format!("--out-dir {}: cannot remove the probe file {}", dir.display(), probe.display())
        })?;
        Ok(dir)
    }
}
