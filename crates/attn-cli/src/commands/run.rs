//! `attn run`: reads `q`, `k`, `v` (and optionally `mask`, `bias`, `key_lengths`) from one
//! safetensors file or from `.npy` files, runs attention with the chosen kernel and options, and
//! writes `out`, `lse` (and `weights`) to a safetensors file. Every refusal is one line naming the
//! file, the tensor and what was expected versus found.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use attn_kernels::{
    attention, Align, AttnError, AttnParams, Broadcast, Dropout, Kernel, KvView, MaskSpec, View4, Window,
};

use crate::io::{read_npy, read_safetensors, write_safetensors, HostData, HostTensor, IoError, IoErrorKind};

/// Tensor names accepted in the input file.
const ACCEPTED: [&str; 6] = ["q", "k", "v", "mask", "bias", "key_lengths"];

/// Arguments of `attn run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Safetensors file holding `q: [B, Hq, Lq, D]`, `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`
    /// and optionally `mask` (BOOL/U8, broadcastable to `[B, Hq, Lq, Lk]`), `bias` (float,
    /// broadcastable) and `key_lengths` (I32/I64, `[B]`).
    #[arg(required_unless_present = "q", conflicts_with = "q")]
    pub input: Option<PathBuf>,
    /// Output safetensors file: `out: [B, Hq, Lq, Dv]`, `lse: [B, Hq, Lq]` and, with `--weights`,
    /// `weights: [B, Hq, Lq, Lk]`, all F32.
    #[arg(short, long)]
    pub output: PathBuf,
    /// `.npy` file of `q: [B, Hq, Lq, D]`, instead of INPUT.
    #[arg(long, requires_all = ["k", "v"])]
    pub q: Option<PathBuf>,
    /// `.npy` file of `k: [B, Hkv, Lk, D]`.
    #[arg(long, requires = "q")]
    pub k: Option<PathBuf>,
    /// `.npy` file of `v: [B, Hkv, Lk, Dv]`.
    #[arg(long, requires = "q")]
    pub v: Option<PathBuf>,
    /// `.npy` file of the boolean mask (true = may attend), broadcastable to `[B, Hq, Lq, Lk]`.
    #[arg(long, requires = "q")]
    pub mask: Option<PathBuf>,
    /// `.npy` file of the additive bias, broadcastable to `[B, Hq, Lq, Lk]`.
    #[arg(long, requires = "q")]
    pub bias: Option<PathBuf>,
    /// `.npy` file of the valid key count per batch, `[B]`.
    #[arg(long, requires = "q")]
    pub key_lengths: Option<PathBuf>,
    /// Causal masking.
    #[arg(long)]
    pub causal: bool,
    /// Where the causal diagonal and window centre sit when `Lq != Lk`.
    #[arg(long, value_enum, default_value = "top-left")]
    pub align: AlignArg,
    /// Sliding window `LEFT,RIGHT` around the aligned diagonal; -1 means unbounded.
    #[arg(long, value_parser = parse_window, allow_hyphen_values = true)]
    pub window: Option<Window>,
    /// Score multiplier (default `1/sqrt(D)`).
    #[arg(long, allow_hyphen_values = true)]
    pub scale: Option<f64>,
    /// Soft-capping value: scores become `cap·tanh(s/cap)`.
    #[arg(long)]
    pub softcap: Option<f64>,
    /// Dropout probability on the attention weights, in `[0, 1)`.
    #[arg(long)]
    pub dropout: Option<f32>,
    /// Seed of the dropout generator.
    #[arg(long, requires = "dropout")]
    pub seed: Option<u64>,
    /// Also write the attention weights (before dropout).
    #[arg(long)]
    pub weights: bool,
    /// Kernel: reference, auto, flash-avx512, flash-avx2 or flash-portable.
    #[arg(long, default_value = "auto", value_parser = parse_kernel)]
    pub kernel: Kernel,
}

/// The `--align` values.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum AlignArg {
    /// Query `i` aligned with key `i` (PyTorch).
    TopLeft,
    /// Last query aligned with last key (FlashAttention).
    BottomRight,
}

/// Runs `attn run`.
pub fn main(args: Args) -> Result<()> {
    if !args.kernel.is_available() {
        let available: Vec<_> = Kernel::ALL.iter().filter(|k| k.is_available()).map(|k| k.name()).collect();
        bail!("kernel '{}' is not available on this CPU; available: {}", args.kernel.name(), available.join(", "));
    }
    let inputs = match &args.input {
        Some(path) => Inputs::from_safetensors(path)?,
        None => Inputs::from_npy(&args)?,
    };
    let (out, lse, weights) = compute(&args, &inputs)?;
    let mut tensors = vec![("out", &out), ("lse", &lse)];
    if let Some(w) = &weights {
        tensors.push(("weights", w));
    }
    write_safetensors(&args.output, &tensors)?;
    let shapes: Vec<String> = tensors.iter().map(|(n, t)| format!("{n} {:?}", t.shape)).collect();
    println!(
        "{} -> {} kernel -> {} written to {}",
        inputs.describe(),
        args.kernel.name(),
        shapes.join(", "),
        args.output.display()
    );
    Ok(())
}

/// A tensor and the file it came from.
struct Sourced {
    file: String,
    tensor: HostTensor,
}

impl Sourced {
    fn error(&self, name: &str, kind: IoErrorKind) -> IoError {
        IoError::tensor(&self.file, name, kind)
    }

    /// The dimensions of a rank-4 `[B, H, L, D]` tensor.
    fn dims4(&self, name: &str) -> Result<[usize; 4], IoError> {
        <[usize; 4]>::try_from(self.tensor.shape.as_slice()).map_err(|_| {
            self.error(
                name,
                IoErrorKind::Shape { found: self.tensor.shape.clone(), expected: "rank 4 [B, H, L, D]".into() },
            )
        })
    }
}

/// The input tensors of one run.
struct Inputs {
    q: Sourced,
    k: Sourced,
    v: Sourced,
    mask: Option<Sourced>,
    bias: Option<Sourced>,
    key_lengths: Option<Sourced>,
}

impl Inputs {
    fn from_safetensors(path: &Path) -> Result<Self, IoError> {
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

    fn from_npy(args: &Args) -> Result<Self, IoError> {
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

    /// The file that holds tensor `name` (`q` for errors about no tensor in particular).
    fn file_of(&self, name: &str) -> &str {
        let t = match name {
            "k" => Some(&self.k),
            "v" => Some(&self.v),
            "mask" => self.mask.as_ref(),
            "bias" => self.bias.as_ref(),
            "key_lengths" => self.key_lengths.as_ref(),
            _ => None,
        };
        &t.unwrap_or(&self.q).file
    }

    /// One line listing every input with its shape and type.
    fn describe(&self) -> String {
        let roles = [("q", Some(&self.q)), ("k", Some(&self.k)), ("v", Some(&self.v))];
        let optional =
            [("mask", self.mask.as_ref()), ("bias", self.bias.as_ref()), ("key_lengths", self.key_lengths.as_ref())];
        roles
            .into_iter()
            .chain(optional)
            .filter_map(|(n, s)| s.map(|s| format!("{n} {:?} {}", s.tensor.shape, s.tensor.dtype_name())))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks and converts the inputs, runs the kernel and returns `out`, `lse` and `weights`.
fn compute(args: &Args, inputs: &Inputs) -> Result<(HostTensor, HostTensor, Option<HostTensor>)> {
    let qd = inputs.q.dims4("q")?;
    let (kd, vd) = (inputs.k.dims4("k")?, inputs.v.dims4("v")?);
    let q_data = inputs.q.tensor.to_f32_vec().map_err(|e| inputs.q.error("q", e))?;
    let (k_data, v_data) = (kv_data(&inputs.k, "k")?, kv_data(&inputs.v, "v")?);
    let mask_data = match &inputs.mask {
        Some(m) => Some(m.tensor.to_bool_vec().map_err(|e| m.error("mask", e))?),
        None => None,
    };
    let bias_data = match &inputs.bias {
        Some(b) => Some(b.tensor.to_f32_vec().map_err(|e| b.error("bias", e))?),
        None => None,
    };
    let key_lengths = match &inputs.key_lengths {
        Some(s) if s.tensor.shape.len() != 1 => {
            return Err(s
                .error(
                    "key_lengths",
                    IoErrorKind::Shape { found: s.tensor.shape.clone(), expected: "rank 1 [B]".into() },
                )
                .into())
        }
        Some(s) => Some(s.tensor.to_usize_vec().map_err(|e| s.error("key_lengths", e))?),
        None => None,
    };
    let attn_err = |e: AttnError| attn_error(inputs, e);
    let q = View4::contiguous("q", &q_data, qd).map_err(attn_err)?;
    let k = kv_view("k", &k_data, kd).map_err(attn_err)?;
    let v = kv_view("v", &v_data, vd).map_err(attn_err)?;
    let keep = match (&inputs.mask, &mask_data) {
        (Some(m), Some(d)) => Some(Broadcast::new("mask", d, &m.tensor.shape).map_err(attn_err)?),
        _ => None,
    };
    let bias = match (&inputs.bias, &bias_data) {
        (Some(b), Some(d)) => Some(Broadcast::new("bias", d, &b.tensor.shape).map_err(attn_err)?),
        _ => None,
    };
    let align = match args.align {
        AlignArg::TopLeft => Align::TopLeft,
        AlignArg::BottomRight => Align::BottomRight,
    };
    let params = AttnParams {
        scale: args.scale,
        mask: MaskSpec {
            causal: args.causal,
            window: args.window,
            align,
            key_lengths: key_lengths.as_deref(),
            keep,
            bias,
        },
        softcap: args.softcap,
        dropout: args.dropout.map(|p| Dropout { p, seed: args.seed.unwrap_or(0) }),
    };
    let res = attention(args.kernel, &q, &k, &v, &params, args.weights).map_err(attn_err)?;
    let [b, hq, lq, _] = qd;
    let f32_tensor = |shape: Vec<usize>, data: Vec<f32>| HostTensor { shape, data: HostData::F32(data) };
    Ok((
        f32_tensor(vec![b, hq, lq, vd[3]], res.out),
        f32_tensor(vec![b, hq, lq], res.lse),
        res.weights.map(|w| f32_tensor(vec![b, hq, lq, kd[2]], w)),
    ))
}

/// Key/value elements in a type the kernels take: F16, BF16 and F32 borrowed, F64 as `f32`.
fn kv_data<'a>(s: &'a Sourced, name: &str) -> Result<Cow<'a, HostData>, IoError> {
    match &s.tensor.data {
        HostData::F16(_) | HostData::Bf16(_) | HostData::F32(_) => Ok(Cow::Borrowed(&s.tensor.data)),
        _ => s.tensor.to_f32_vec().map(|v| Cow::Owned(HostData::F32(v))).map_err(|e| s.error(name, e)),
    }
}

/// A `[B, H, L, D]` view of data from [`kv_data`].
fn kv_view<'a>(name: &'static str, data: &'a HostData, dims: [usize; 4]) -> Result<KvView<'a>, AttnError> {
    Ok(match data {
        HostData::F16(d) => View4::contiguous(name, d, dims)?.into(),
        HostData::Bf16(d) => View4::contiguous(name, d, dims)?.into(),
        HostData::F32(d) => View4::contiguous(name, d, dims)?.into(),
        other => {
            let reason = format!("dtype {}, expected F16, BF16 or F32", other.dtype().name());
            return Err(AttnError::Layout { tensor: name, reason });
        }
    })
}

/// A kernel refusal as one line naming the file of the tensor concerned, or the option.
fn attn_error(inputs: &Inputs, e: AttnError) -> anyhow::Error {
    match &e {
        AttnError::Param { .. } => anyhow!("option --{e}"),
        AttnError::DimMismatch { tensor, .. }
        | AttnError::Layout { tensor, .. }
        | AttnError::Broadcast { tensor, .. } => {
            anyhow!("{}: {e}", inputs.file_of(tensor))
        }
        AttnError::Heads(_) | AttnError::Output { .. } => anyhow!("{}: {e}", inputs.file_of("q")),
    }
}

fn parse_kernel(s: &str) -> Result<Kernel, String> {
    s.parse()
}

fn parse_window(s: &str) -> Result<Window, String> {
    let side = |x: &str| -> Result<Option<usize>, String> {
        match x.trim().parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(n) if n >= 0 => usize::try_from(n).map(Some).map_err(|e| e.to_string()),
            _ => Err(format!("'{x}' is not a window size, expected an integer >= -1")),
        }
    };
    let (left, right) = s.split_once(',').ok_or_else(|| format!("'{s}', expected LEFT,RIGHT"))?;
    Ok(Window { left: side(left)?, right: side(right)? })
}
