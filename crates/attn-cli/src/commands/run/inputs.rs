//! The inputs of `attn run`: each tensor with the file it came from, read from one safetensors
//! file or from `.npy` files, checked for its role and converted into the `attn` library's call;
//! the library's refusals are reported naming the file of the tensor concerned.

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use attn::{sdpa_full, AttnLibError, Mask, SdpaOptions, SdpaOutput};
use attn_kernels::AttnError;
use candle_core::Tensor;

use super::Args;
use crate::io::{read_npy, read_safetensors, HostData, HostTensor, IoError, IoErrorKind};

/// Tensor names accepted in the input file.
const ACCEPTED: [&str; 6] = ["q", "k", "v", "mask", "bias", "key_lengths"];

/// A tensor and the file it came from.
struct Sourced {
    file: String,
    tensor: HostTensor,
}

impl Sourced {
    /// The tensor converted by `f`; a refusal names the file and the tensor `name`.
    fn convert<T>(self, name: &str, f: impl FnOnce(HostTensor) -> Result<T, IoErrorKind>) -> Result<T, IoError> {
        let Sourced { file, tensor } = self;
        f(tensor).map_err(|kind| IoError::tensor(file, name, kind))
    }
}

/// The input tensors of one run.
pub(super) struct Inputs {
    q: Sourced,
    k: Sourced,
    v: Sourced,
    mask: Option<Sourced>,
    bias: Option<Sourced>,
    key_lengths: Option<Sourced>,
}

impl Inputs {
    /// Every tensor of the safetensors file `path`, which must hold `q`, `k` and `v` and nothing
    /// but [`ACCEPTED`] names.
    pub(super) fn from_safetensors(path: &Path) -> Result<Self, IoError> {
        let file = path.display().to_string();
        let mut map = read_safetensors(path)?;
        if let Some(name) = map.keys().find(|n| !ACCEPTED.contains(&n.as_str())) {
            return Err(IoError::tensor(&file, name, IoErrorKind::Unknown { accepted: ACCEPTED.join(", ") }));
        }
        let present: Vec<String> = map.keys().cloned().collect();
        let found = if present.is_empty() { "no tensors".to_string() } else { present.join(", ") };
        let mut take = |name: &str| map.remove(name).map(|tensor| Sourced { file: file.clone(), tensor });
        let mut need = |name: &str| {
            take(name).ok_or_else(|| IoError::tensor(&file, name, IoErrorKind::Missing { found: found.clone() }))
        };
        let (q, k, v) = (need("q")?, need("k")?, need("v")?);
        Ok(Self { q, k, v, mask: take("mask"), bias: take("bias"), key_lengths: take("key_lengths") })
    }

    /// The `.npy` files named by `--q`, `--k`, `--v` and the optional `--mask`, `--bias`,
    /// `--key-lengths`.
    pub(super) fn from_npy(args: &Args) -> Result<Self, IoError> {
        let read = |path: &Option<PathBuf>| -> Result<Option<Sourced>, IoError> {
            path.as_deref().map(|p| Ok(Sourced { file: p.display().to_string(), tensor: read_npy(p)? })).transpose()
        };
        let need = |path: &Option<PathBuf>, name: &str| {
            read(path)?.ok_or_else(|| {
                IoError::tensor("command line", name, IoErrorKind::Missing { found: "no --q/--k/--v files".into() })
            })
        };
        Ok(Self {
            q: need(&args.q, "q")?,
            k: need(&args.k, "k")?,
            v: need(&args.v, "v")?,
            mask: read(&args.mask)?,
            bias: read(&args.bias)?,
            key_lengths: read(&args.key_lengths)?,
        })
    }

    /// The tensors present, by role, `q` first.
    fn roles(&self) -> impl Iterator<Item = (&'static str, &Sourced)> {
        let optional =
            [("mask", self.mask.as_ref()), ("bias", self.bias.as_ref()), ("key_lengths", self.key_lengths.as_ref())];
        [("q", &self.q), ("k", &self.k), ("v", &self.v)]
            .into_iter()
            .chain(optional.into_iter().filter_map(|(n, s)| s.map(|s| (n, s))))
    }

    /// One line listing every input with its shape and type.
    pub(super) fn describe(&self) -> String {
        let parts: Vec<String> =
            self.roles().map(|(n, s)| format!("{n} {:?} {}", s.tensor.shape, s.tensor.dtype_name())).collect();
        parts.join(", ")
    }

    /// Checks each tensor for its role and converts it: `q`, `k`, `v` rank 4 and float (`q` as
    /// F32, so `out` and `weights` come back as F32; `k` and `v` in their stored type), the mask
    /// BOOL/U8 with non-zero = may attend, the bias float, the key lengths I32/I64 `[B]`, the last
    /// three added to `opts`.
    pub(super) fn into_call(self, mut opts: SdpaOptions) -> Result<Call, IoError> {
        let files = self.roles().map(|(n, s)| (n, s.file.clone())).collect();
        let q = self.q.convert("q", |t| {
            let t = rank4(t)?;
            HostTensor { data: HostData::F32(t.to_f32_vec()?), shape: t.shape }.into_float_tensor()
        })?;
        let k = self.k.convert("k", |t| rank4(t)?.into_float_tensor())?;
        let v = self.v.convert("v", |t| rank4(t)?.into_float_tensor())?;
        if let Some(m) = self.mask {
            opts.mask = Some(Mask::keep(m.convert("mask", HostTensor::into_mask_tensor)?));
        }
        if let Some(b) = self.bias {
            opts.bias = Some(b.convert("bias", HostTensor::into_float_tensor)?);
        }
        if let Some(kl) = self.key_lengths {
            opts.key_lengths = Some(kl.convert("key_lengths", |t| match t.shape.len() {
                1 => t.to_usize_vec(),
                _ => Err(IoErrorKind::Shape { found: t.shape, expected: "rank 1 [B]".into() }),
            })?);
        }
        Ok(Call { q, k, v, opts, files })
    }
}

/// `t` if it has rank 4, `[B, H, L, D]`.
fn rank4(t: HostTensor) -> Result<HostTensor, IoErrorKind> {
    match t.shape.len() {
        4 => Ok(t),
        _ => Err(IoErrorKind::Shape { found: t.shape, expected: "rank 4 [B, H, L, D]".into() }),
    }
}

/// One call of the library, with the file of each input for messages.
pub(super) struct Call {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    opts: SdpaOptions,
    /// `(role, file)`, `q` first.
    files: Vec<(&'static str, String)>,
}

impl Call {
    /// Computes the attention; a refusal is one line naming the file of the tensor concerned, or
    /// the option.
    pub(super) fn run(&self) -> anyhow::Result<SdpaOutput> {
        sdpa_full(&self.q, &self.k, &self.v, &self.opts).map_err(|e| self.error(e))
    }

    fn error(&self, e: AttnLibError) -> anyhow::Error {
        let tensor = match &e {
            AttnLibError::Kernel(AttnError::Param { .. }) => return anyhow!("option --{e}"),
            AttnLibError::Kernel(
                AttnError::DimMismatch { tensor, .. }
                | AttnError::Layout { tensor, .. }
                | AttnError::Broadcast { tensor, .. },
            )
            | AttnLibError::Shape { tensor, .. }
            | AttnLibError::DType { tensor, .. }
            | AttnLibError::Device { tensor, .. } => *tensor,
            _ => "q",
        };
        let file = self.files.iter().find(|(n, _)| *n == tensor).unwrap_or(&self.files[0]);
        anyhow!("{}: {e}", file.1)
    }
}
