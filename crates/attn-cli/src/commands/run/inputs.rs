//! The inputs of `attn run`: each tensor with the file it came from, read from one safetensors
//! file or `.npz` archive, or from `.npy` files, checked for its role and converted into the
//! `attn` library's call (`sdpa_full`, or `sdpa_varlen_full` for packed sequences, see
//! [`packed`](super::packed)); the library's refusals are reported naming the file of the tensor
//! concerned. With `grad_out`
//! the call also runs backward through candle's autograd: `q`, `k`, `v`, the bias and the sinks
//! become `Var`s and `Σ out·grad_out` is differentiated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::anyhow;
use attn::linear::LinearOptions;
use attn::sparse::Pattern;
use attn::AttnError;
use attn::{linear_attention, sdpa_full, sdpa_varlen_full, AttnLibError, Mask, SdpaOptions};
use attn_kernels::Dims;
use candle_core::{DType, Tensor, Var};

use super::linear::refuse_softmax_only;
use super::packed::{self, Offsets};
use super::sourced::Sourced;
use super::Args;
use crate::commands::sdpa_flags::pattern_error;
use crate::io::{read_npy, read_tensors, HostData, HostTensor, IoError, IoErrorKind};

/// Tensor names accepted in the input file.
const ACCEPTED: [&str; 10] =
    ["q", "k", "v", "mask", "bias", "key_lengths", "grad_out", "sinks", "cu_seqlens_q", "cu_seqlens_k"];

/// The input tensors of one run.
pub(super) struct Inputs {
    q: Sourced,
    k: Sourced,
    v: Sourced,
    mask: Option<Sourced>,
    bias: Option<Sourced>,
    key_lengths: Option<Sourced>,
    sinks: Option<Sourced>,
    grad_out: Option<Sourced>,
    /// The offsets of packed sequences, `[B + 1]` each (INPUT files only).
    cu_seqlens_q: Option<Sourced>,
    cu_seqlens_k: Option<Sourced>,
}

impl Inputs {
    /// Every tensor of the safetensors file or `.npz` archive `path`, which must hold `q`, `k` and
    /// `v` and nothing but [`ACCEPTED`] names. A `.npy` file is refused pointing to `--q`/`--k`/`--v`.
    pub(super) fn from_file(path: &Path) -> anyhow::Result<Self> {
        let file = path.display().to_string();
        let mut map = read_tensors(path).map_err(|e| match e.kind {
            IoErrorKind::SingleArray => anyhow!(
                "{e}; pass .npy files with --q, --k, --v (and --mask, --bias, --key-lengths, --sinks, --grad-out) \
                 instead"
            ),
            _ => e.into(),
        })?;
        if let Some(name) = map.keys().find(|n| !ACCEPTED.contains(&n.as_str())) {
            return Err(IoError::tensor(&file, name, IoErrorKind::Unknown { accepted: ACCEPTED.join(", ") }).into());
        }
        let present: Vec<String> = map.keys().cloned().collect();
        let found = if present.is_empty() { "no tensors".to_string() } else { present.join(", ") };
        let mut take = |name: &str| map.remove(name).map(|tensor| Sourced { file: file.clone(), tensor });
        let mut need = |name: &str| {
            take(name).ok_or_else(|| IoError::tensor(&file, name, IoErrorKind::Missing { found: found.clone() }))
        };
        let (q, k, v) = (need("q")?, need("k")?, need("v")?);
        let (mask, bias, key_lengths) = (take("mask"), take("bias"), take("key_lengths"));
        let (sinks, grad_out) = (take("sinks"), take("grad_out"));
        let (cu_seqlens_q, cu_seqlens_k) = (take("cu_seqlens_q"), take("cu_seqlens_k"));
        Ok(Self { q, k, v, mask, bias, key_lengths, sinks, grad_out, cu_seqlens_q, cu_seqlens_k })
    }

    /// The `.npy` files named by `--q`, `--k`, `--v` and the optional `--mask`, `--bias`,
    /// `--key-lengths`, `--sinks`, `--grad-out`.
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
            sinks: read(&args.sinks)?,
            grad_out: read(&args.grad_out)?,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
        })
    }

    /// The tensors present, by role, `q` first.
    fn roles(&self) -> impl Iterator<Item = (&'static str, &Sourced)> {
        let optional = [
            ("mask", self.mask.as_ref()),
            ("bias", self.bias.as_ref()),
            ("key_lengths", self.key_lengths.as_ref()),
            ("sinks", self.sinks.as_ref()),
            ("grad_out", self.grad_out.as_ref()),
            ("cu_seqlens_q", self.cu_seqlens_q.as_ref()),
            ("cu_seqlens_k", self.cu_seqlens_k.as_ref()),
        ];
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

    /// Checks each tensor for its role and converts it: `q`, `k`, `v` rank 4 (rank 3 when packed)
    /// and float (`q` as F32, so `out` and `weights` come back as F32; `k` and `v` in their stored
    /// type), the output's gradient float `[B, Hq, Lq, Dv]` (packed: `[total_q, Hq, Dv]`; as F32),
    /// the mask BOOL/U8 with non-zero = may attend, the bias float, the key lengths I32/I64 `[B]`,
    /// the sinks float rank 1 (their length `Hq` is the library's check), these four added to
    /// `opts`; the packed offsets as [`packed::offsets`] says.
    pub(super) fn into_call(self, mut opts: SdpaOptions, linear: Option<LinearOptions>) -> Result<Call, IoError> {
        let files = self.roles().map(|(n, s)| (n, s.file.clone())).collect();
        if linear.is_some() {
            let cu = [("cu_seqlens_q", &self.cu_seqlens_q), ("cu_seqlens_k", &self.cu_seqlens_k)];
            refuse_softmax_only(
                [("mask", &self.mask), ("bias", &self.bias), ("sinks", &self.sinks)].into_iter().chain(cu),
            )?;
        }
        let dense_only = [("mask", &self.mask), ("bias", &self.bias), ("key_lengths", &self.key_lengths)];
        let offsets = packed::offsets(self.cu_seqlens_q, self.cu_seqlens_k, &self.q.file, dense_only)?;
        let (rank, grad_dims) = if offsets.is_some() { (3, "[total_q, Hq, Dv]") } else { (4, "[B, Hq, Lq, Dv]") };
        let q = self.q.convert("q", |t| with_rank(t, rank)?.into_f32_tensor())?;
        let k = self.k.convert("k", |t| with_rank(t, rank)?.into_float_tensor())?;
        let v = self.v.convert("v", |t| with_rank(t, rank)?.into_float_tensor())?;
        let grad_out = match self.grad_out {
            Some(g) => {
                // `q` and `v` have rank `rank` here: all but the last size of `q`, then `Dv` of `v`.
                let want: Vec<usize> = q.dims()[..rank - 1].iter().chain(&v.dims()[rank - 1..]).copied().collect();
                Some(g.convert("grad_out", |t| {
                    if t.shape != want {
                        let expected = format!("{grad_dims} = {want:?} (from q and v)");
                        return Err(IoErrorKind::Shape { found: t.shape, expected });
                    }
                    t.into_f32_tensor()
                })?)
            }
            None => None,
        };
        if let Some(m) = self.mask {
            opts.mask = Some(Mask::keep(m.convert("mask", HostTensor::into_mask_tensor)?));
        }
        if let Some(b) = self.bias {
            opts.bias = Some(b.convert("bias", HostTensor::into_float_tensor)?);
        }
        if let Some(kl) = self.key_lengths {
            opts.key_lengths = Some(kl.convert("key_lengths", |t| packed::rank1_counts(t, "[B]"))?);
        }
        if let Some(s) = self.sinks {
            opts.sinks = Some(s.convert("sinks", |t| match t.shape.len() {
                1 => t.into_float_tensor(),
                _ => Err(IoErrorKind::Shape { found: t.shape, expected: "rank 1 [Hq]".into() }),
            })?);
        }
        let linear = linear.map(|l| LinearOptions { key_lengths: opts.key_lengths.clone(), ..l });
        Ok(Call { q, k, v, grad_out, opts, linear, offsets, files })
    }
}

impl HostTensor {
    /// A float tensor converted to a CPU `F32` candle tensor of the same shape.
    pub(super) fn into_f32_tensor(self) -> Result<Tensor, IoErrorKind> {
        HostTensor { data: HostData::F32(self.to_f32_vec()?), shape: self.shape }.into_float_tensor()
    }
}

/// `t` if it has rank `rank`: 4, `[B, H, L, D]`, or 3 for packed sequences, `[total, H, D]`.
fn with_rank(t: HostTensor, rank: usize) -> Result<HostTensor, IoErrorKind> {
    match t.shape.len() {
        r if r == rank => Ok(t),
        _ if rank == 3 => Err(IoErrorKind::Shape {
            found: t.shape,
            expected: "rank 3 [total, H, D] (packed sequences: cu_seqlens_q and cu_seqlens_k are given)".into(),
        }),
        _ => Err(IoErrorKind::Shape { found: t.shape, expected: "rank 4 [B, H, L, D]".into() }),
    }
}

/// One call of the library, with the file of each input for messages.
pub(super) struct Call {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// The output's gradient, `[B, Hq, Lq, Dv]` F32, when the gradients are asked for.
    grad_out: Option<Tensor>,
    opts: SdpaOptions,
    /// Linear attention's options, which replace `opts` when given (`attn run --linear`).
    linear: Option<LinearOptions>,
    /// The packed sequences' offsets, when `q`, `k`, `v` are packed.
    offsets: Option<Offsets>,
    /// `(role, file)`, `q` first.
    files: Vec<(&'static str, String)>,
}

/// What one run computes.
pub(super) struct RunOutput {
    /// `out`, and `lse` and the weights when asked (softmax attention only).
    pub out: Tensor,
    pub lse: Option<Tensor>,
    pub weights: Option<Tensor>,
    /// With the weights, the keep-mask `[B, Hq, Lq, Lk]` (`U8`) of the cells masking set to 0.
    pub keep: Option<Tensor>,
    /// `dq`, `dk`, `dv`, `dbias` (with a bias) and `dsinks` (with sinks) as F32 when `grad_out` is
    /// given, else empty.
    pub grads: Vec<(&'static str, Tensor)>,
}

/// The attention part of a [`RunOutput`].
struct Attended {
    out: Tensor,
    lse: Option<Tensor>,
    weights: Option<Tensor>,
}

impl Call {
    /// The sizes of the softmax calls this call runs as: its own when dense, one per sequence
    /// when packed (`B = 1`, each sequence's lengths); none for linear attention.
    pub(super) fn calls(&self) -> Vec<Dims> {
        match (self.q.dims(), self.k.dims(), self.v.dims(), &self.offsets, &self.linear) {
            (&[b, hq, lq, dk], &[_, hkv, lk, _], &[.., dv], None, None) => vec![Dims { b, hq, hkv, lq, lk, dk, dv }],
            (&[_, hq, dk], &[_, hkv, _], &[.., dv], Some(o), None) => {
                let len = |cu: &[usize], s: usize| cu[s + 1].saturating_sub(cu[s]);
                (0..o.q.len().min(o.k.len()).saturating_sub(1))
                    .map(|s| Dims { b: 1, hq, hkv, lq: len(&o.q, s), lk: len(&o.k, s), dk, dv })
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// Adds the block mask of `pattern` for this call's `Lq × Lk` (`q: [B, Hq, Lq, D]`,
    /// `k: [B, Hkv, Lk, D]`) and returns the fraction of blocks it lists; a pattern that does not
    /// fit the sizes is refused naming its flag, and so are packed sequences.
    pub(super) fn set_pattern(&mut self, pattern: &Pattern) -> anyhow::Result<f64> {
        let (&[_, _, lq, _], &[_, _, lk, _], None) = (self.q.dims(), self.k.dims(), &self.offsets) else {
            return Err(anyhow!(
                "--pattern {}: packed sequences (cu_seqlens_q, cu_seqlens_k in {}) take no block-sparse pattern",
                pattern.name(),
                self.files[0].1
            ));
        };
        let mask = pattern.block_mask(lq, lk).map_err(pattern_error)?;
        let density = mask.density();
        self.opts.block_mask = Some(Arc::new(mask));
        Ok(density)
    }

    /// Computes the attention and, with `grad_out`, the gradients of `Σ out·grad_out` through
    /// candle's autograd (the library's backward, by the same kernel and dropout seed); a refusal
    /// is one line naming the file of the tensor concerned, or the option.
    pub(super) fn run(&self) -> anyhow::Result<RunOutput> {
        // After the attention, whose weights are larger: a call too large fails on those first.
        let keep = || -> anyhow::Result<Option<Tensor>> {
            if !self.opts.return_weights {
                return Ok(None);
            }
            // `q` and `k` have rank 4 here: `[B, Hq, Lq]` of `q`, then `Lk` of `k`.
            let (q, lk) = (self.q.dims(), self.k.dims()[2]);
            Ok(Some(self.opts.keep_mask(q[0], q[1], q[2], lk).map_err(|e| self.error(e))?))
        };
        let Some(grad_out) = &self.grad_out else {
            let sdpa = self.attend(&self.q, &self.k, &self.v, &self.opts)?;
            return Ok(RunOutput {
                out: sdpa.out,
                lse: sdpa.lse,
                weights: sdpa.weights,
                keep: keep()?,
                grads: Vec::new(),
            });
        };
        let var = |t: &Tensor| Var::from_tensor(t).map_err(|e| self.candle_error(e));
        let (q, k, v) = (var(&self.q)?, var(&self.k)?, var(&self.v)?);
        let bias = self.opts.bias.as_ref().map(var).transpose()?;
        let sinks = self.opts.sinks.as_ref().map(var).transpose()?;
        let tracked = |v: &Option<Var>| v.as_ref().map(|v| v.as_tensor().clone());
        let opts = SdpaOptions { bias: tracked(&bias), sinks: tracked(&sinks), ..self.opts.clone() };
        let sdpa = self.attend(&q, &k, &v, &opts)?;
        let store = (&sdpa.out * grad_out)
            .and_then(|prod| prod.sum_all())
            .and_then(|loss| loss.backward())
            .map_err(|e| self.candle_error(e))?;
        let optional = [("dbias", bias.as_ref()), ("dsinks", sinks.as_ref())];
        let wanted = [("dq", &q), ("dk", &k), ("dv", &v)]
            .into_iter()
            .chain(optional.into_iter().filter_map(|(n, v)| v.map(|v| (n, v))));
        let grads = wanted
            .map(|(name, var)| {
                let grad = store.get(var).ok_or_else(|| anyhow!("{}: no gradient reached {name}", self.files[0].1))?;
                Ok((name, grad.to_dtype(DType::F32).map_err(|e| self.candle_error(e))?))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(RunOutput { out: sdpa.out, lse: sdpa.lse, weights: sdpa.weights, keep: keep()?, grads })
    }

    /// The library's attention on `q`, `k`, `v`: dense, packed when the offsets are given, or
    /// linear (no `lse`, no weights).
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> anyhow::Result<Attended> {
        let result = match (&self.linear, &self.offsets) {
            (Some(l), _) => linear_attention(q, k, v, l).map(|out| Attended { out, lse: None, weights: None }),
            (None, None) => {
                sdpa_full(q, k, v, opts).map(|r| Attended { out: r.out, lse: Some(r.lse), weights: r.weights })
            }
            (None, Some(Offsets { q: cq, k: ck })) => sdpa_varlen_full(q, k, v, cq, ck, opts).map(|r| Attended {
                out: r.out,
                lse: Some(r.lse),
                weights: None,
            }),
        };
        result.map_err(|e| self.error(e))
    }

    /// A candle error while computing, as one line naming `q`'s file; a library refusal inside
    /// it keeps its own text.
    fn candle_error(&self, e: candle_core::Error) -> anyhow::Error {
        let text = e.to_string();
        let line = text.lines().next().unwrap_or_default();
        anyhow!("{}: {line}", self.files[0].1)
    }

    fn error(&self, e: AttnLibError) -> anyhow::Error {
        let tensor = match &e {
            AttnLibError::Value { field: "return_weights", reason } => return anyhow!("option --weights: {reason}"),
            // Sinks and the packed offsets are tensors of the input, not options.
            AttnLibError::Kernel(AttnError::Param {
                field: field @ ("sinks" | "cu_seqlens_q" | "cu_seqlens_k"),
                ..
            }) => *field,
            AttnLibError::Kernel(AttnError::Param { .. }) => return anyhow!("option --{e}"),
            // Names its buffer and size, which no input file holds.
            AttnLibError::Kernel(AttnError::Alloc(_)) => return anyhow!("{e}"),
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
        // One line: a wrapped candle error carries its backtrace on the lines after.
        let text = e.to_string();
        anyhow!("{}: {}", file.1, text.lines().next().unwrap_or_default())
    }
}
