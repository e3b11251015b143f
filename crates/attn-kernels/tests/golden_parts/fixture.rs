//! One golden fixture as written by `scripts/gen_fixtures.py`: the inputs, the PyTorch float64
//! results (forward, and the gradients when the file holds them) and the call's options, read from
//! a safetensors file, and the `AttnParams` they imply. Every problem with a file is an error naming
//! the file and the tensor or metadata field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use attn_kernels::{Align, AttnParams, Broadcast, MaskSpec, View4, Window};
use attn_testkit::fixtures;
use safetensors::{Dtype, SafeTensors};

/// The directory holding the fixtures.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// Every `*.safetensors` file of [`fixture_dir`], sorted by name.
pub fn fixture_paths() -> Vec<PathBuf> {
    fixtures::safetensors_in(&fixture_dir())
}

/// PyTorch's own bf16 results of a `bf16_*` fixture (`F.scaled_dot_product_attention`, math
/// backend, on the fixture's bf16 inputs): the baseline error of bfloat16 products. Read by
/// `golden_bf16.rs` alone.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct TorchBf16 {
    /// `out_bf16`, like `out`.
    pub out: Tensor<f64>,
    /// `dq_bf16`, `dk_bf16`, `dv_bf16`, like `dq`, `dk`, `dv`.
    pub dq: Tensor<f64>,
    pub dk: Tensor<f64>,
    pub dv: Tensor<f64>,
    /// `dbias_bf16`, like the bias, when there is one.
    pub dbias: Option<Tensor<f64>>,
}

/// A tensor read from a fixture: row-major `data` of the given `shape`.
#[derive(Debug, Clone)]
pub struct Tensor<T> {
    /// Elements, row-major.
    pub data: Vec<T>,
    /// Shape as stored.
    pub shape: Vec<usize>,
}

impl<T> Tensor<T> {
    /// The shape as `[B, H, L, D]`; the loader has checked the rank.
    pub fn dims4(&self) -> [usize; 4] {
        [self.shape[0], self.shape[1], self.shape[2], self.shape[3]]
    }
}

/// The scalar options of a fixture's call, from the safetensors metadata.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// `None` = the default `1/√Dk`.
    pub scale: Option<f64>,
    /// Causal masking.
    pub causal: bool,
    /// Alignment of the causal diagonal and the window centre.
    pub align: Align,
    /// Sliding window, `None` when both sides are unbounded.
    pub window: Option<Window>,
    /// Logit soft-capping value.
    pub softcap: Option<f64>,
}

/// A fixture's gradient part: an output gradient and PyTorch's float64 autograd gradients of
/// `(out * grad_out).sum()`.
// Read by `golden_gradients.rs` only.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct Grads {
    /// The output gradient `dO: [B, Hq, Lq, Dv]`.
    pub grad_out: Tensor<f64>,
    /// `dq: [B, Hq, Lq, Dk]`.
    pub dq: Tensor<f64>,
    /// `dk: [B, Hkv, Lk, Dk]`, summed over the query heads of each key/value head.
    pub dk: Tensor<f64>,
    /// `dv: [B, Hkv, Lk, Dv]`, summed over the query heads of each key/value head.
    pub dv: Tensor<f64>,
    /// The bias's gradient in the bias's own shape; present exactly when the fixture has a bias.
    pub dbias: Option<Tensor<f64>>,
    /// The sinks' gradient `[Hq]`; present exactly when the fixture has sinks.
    pub dsinks: Option<Tensor<f64>>,
}

/// One fixture: inputs `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`, the optional
/// `mask`/`bias` (broadcastable to `[B, Hq, Lq, Lk]`), `key_lengths: [B]` and `sinks: [Hq]`, the expected
/// `out: [B, Hq, Lq, Dv]`, `lse: [B, Hq, Lq]`, `weights: [B, Hq, Lq, Lk]`, and the gradients when
/// the file holds them.
// `golden.rs` reads the forward results, `golden_gradients.rs` the gradients.
#[allow(dead_code)]
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The file name, for messages.
    pub file: String,
    /// Queries.
    pub q: Tensor<f64>,
    /// Keys.
    pub k: Tensor<f64>,
    /// Values.
    pub v: Tensor<f64>,
    /// Boolean keep-mask.
    pub mask: Option<Tensor<bool>>,
    /// Additive bias.
    pub bias: Option<Tensor<f64>>,
    /// Valid keys per batch.
    pub key_lengths: Option<Vec<usize>>,
    /// Sink logits per query head.
    pub sinks: Option<Tensor<f64>>,
    /// Expected output.
    pub out: Tensor<f64>,
    /// Expected log-sum-exp.
    pub lse: Tensor<f64>,
    /// Expected softmax weights.
    pub weights: Tensor<f64>,
    /// Scalar options.
    pub options: Options,
    /// The gradients, when the file holds `grad_out`, `dq`, `dk`, `dv` (and `dbias` with a bias).
    pub grads: Option<Grads>,
    /// PyTorch's bf16 results, for the `bf16_*` fixtures.
    pub torch_bf16: Option<TorchBf16>,
}

impl Fixture {
    /// Reads and checks the fixture at `path`.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file = path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
        let bytes = std::fs::read(path).map_err(|e| format!("{file}: {e}"))?;
        let (st, meta) = fixtures::parse(&file, &bytes)?;
        let r = Reader { file: &file, st: &st };
        let names = st.names();
        let has = |n: &str| names.contains(&n);
        let (q, k, v) = (r.f64_rank("q", 4)?, r.f64_rank("k", 4)?, r.f64_rank("v", 4)?);
        let bias = if has("bias") { Some(r.f64("bias")?) } else { None };
        let sinks = if has("sinks") { Some(r.f64_rank("sinks", 1)?) } else { None };
        let out = r.f64_rank("out", 4)?;
        let grads = r.grads(&names, [&q, &k, &v, &out], [bias.as_ref(), sinks.as_ref()])?;
        let torch_bf16 = r.torch_bf16(&names, [&q, &k, &v, &out], bias.as_ref())?;
        Ok(Self {
            q,
            k,
            v,
            mask: if has("mask") { Some(r.bool("mask")?) } else { None },
            bias,
            key_lengths: if has("key_lengths") { Some(r.lengths("key_lengths")?) } else { None },
            sinks,
            out,
            lse: r.f64_rank("lse", 3)?,
            weights: r.f64_rank("weights", 4)?,
            options: options(&file, &meta)?,
            grads,
            torch_bf16,
            file,
        })
    }

    /// The call's parameters with `bias` and `sinks` (this fixture's in the caller's precision,
    /// same shapes) in place of the stored ones.
    pub fn params<'a, T: Copy>(
        &'a self,
        bias: Option<&'a [T]>,
        sinks: Option<&'a [T]>,
    ) -> Result<AttnParams<'a, T>, String> {
        let err = |e: attn_kernels::AttnError| format!("{}: {e}", self.file);
        let keep = match &self.mask {
            Some(m) => Some(Broadcast::new("mask", &m.data, &m.shape).map_err(err)?),
            None => None,
        };
        let bias = match (&self.bias, bias) {
            (Some(b), Some(data)) => Some(Broadcast::new("bias", data, &b.shape).map_err(err)?),
            (None, None) => None,
            _ => return Err(format!("{}: bias given for a fixture without one, or missing", self.file)),
        };
        if self.sinks.is_some() != sinks.is_some() {
            return Err(format!("{}: sinks given for a fixture without them, or missing", self.file));
        }
        let o = self.options;
        Ok(AttnParams {
            scale: o.scale,
            mask: MaskSpec {
                causal: o.causal,
                window: o.window,
                align: o.align,
                key_lengths: self.key_lengths.as_deref(),
                keep,
                bias,
                block: None,
            },
            softcap: o.softcap,
            dropout: None,
            score_mod: None,
            sinks,
            compute: attn_kernels::Precision::F32,
        })
    }

    /// `q`, `k` and `v` as views over `data` (this fixture's tensors in some precision).
    pub fn views<'a, T>(&self, data: [&'a [T]; 3]) -> Result<[View4<'a, T>; 3], String> {
        let err = |e: attn_kernels::AttnError| format!("{}: {e}", self.file);
        Ok([
            View4::contiguous("q", data[0], self.q.dims4()).map_err(err)?,
            View4::contiguous("k", data[1], self.k.dims4()).map_err(err)?,
            View4::contiguous("v", data[2], self.v.dims4()).map_err(err)?,
        ])
    }
}

struct Reader<'a> {
    file: &'a str,
    st: &'a SafeTensors<'a>,
}

impl Reader<'_> {
    fn raw(&self, name: &str, dtypes: &[Dtype]) -> Result<(Vec<usize>, &[u8]), String> {
        let t = self.st.tensor(name).map_err(|e| format!("{}: tensor {name}: {e}", self.file))?;
        if !dtypes.contains(&t.dtype()) {
            return Err(format!("{}: tensor {name}: dtype {:?}, expected one of {dtypes:?}", self.file, t.dtype()));
        }
        Ok((t.shape().to_vec(), t.data()))
    }

    fn f64(&self, name: &str) -> Result<Tensor<f64>, String> {
        let (shape, data) = self.raw(name, &[Dtype::F64])?;
        Ok(Tensor { data: fixtures::le_f64(data), shape })
    }

    fn f64_rank(&self, name: &str, rank: usize) -> Result<Tensor<f64>, String> {
        let t = self.f64(name)?;
        if t.shape.len() != rank {
            return Err(format!("{}: tensor {name}: shape {:?}, expected rank {rank}", self.file, t.shape));
        }
        Ok(t)
    }

    /// `f64(name)` of the shape `like` has.
    fn f64_like(&self, name: &str, like: &Tensor<f64>) -> Result<Tensor<f64>, String> {
        let t = self.f64(name)?;
        if t.shape != like.shape {
            return Err(format!("{}: tensor {name}: shape {:?}, expected {:?}", self.file, t.shape, like.shape));
        }
        Ok(t)
    }

    /// The gradient tensors: none or all of `grad_out`, `dq`, `dk`, `dv` (shaped like `out`, `q`,
    /// `k`, `v`), and then `dbias` and `dsinks` (shaped like the bias and the sinks) exactly when
    /// there are a bias and sinks.
    fn grads(
        &self,
        names: &[&str],
        [q, k, v, out]: [&Tensor<f64>; 4],
        [bias, sinks]: [Option<&Tensor<f64>>; 2],
    ) -> Result<Option<Grads>, String> {
        let parts = ["grad_out", "dq", "dk", "dv", "dbias", "dsinks"];
        let present: Vec<&str> = parts.iter().copied().filter(|p| names.contains(p)).collect();
        if present.is_empty() {
            return Ok(None);
        }
        if let Some(missing) = parts[..4].iter().find(|p| !present.contains(p)) {
            return Err(format!("{}: gradient tensors {present:?} present but {missing} missing", self.file));
        }
        let grad_of = |input: Option<&Tensor<f64>>, grad: &str, what: &str| match (input, names.contains(&grad)) {
            (Some(x), true) => self.f64_like(grad, x).map(Some),
            (None, false) => Ok(None),
            (Some(_), false) => Err(format!("{}: {what} but no {grad}", self.file)),
            (None, true) => Err(format!("{}: {grad} without {what}", self.file)),
        };
        Ok(Some(Grads {
            grad_out: self.f64_like("grad_out", out)?,
            dq: self.f64_like("dq", q)?,
            dk: self.f64_like("dk", k)?,
            dv: self.f64_like("dv", v)?,
            dbias: grad_of(bias, "dbias", "a bias")?,
            dsinks: grad_of(sinks, "dsinks", "sinks")?,
        }))
    }

    fn torch_bf16(
        &self,
        names: &[&str],
        [q, k, v, out]: [&Tensor<f64>; 4],
        bias: Option<&Tensor<f64>>,
    ) -> Result<Option<TorchBf16>, String> {
        if !names.contains(&"out_bf16") {
            return Ok(None);
        }
        Ok(Some(TorchBf16 {
            out: self.f64_like("out_bf16", out)?,
            dq: self.f64_like("dq_bf16", q)?,
            dk: self.f64_like("dk_bf16", k)?,
            dv: self.f64_like("dv_bf16", v)?,
            dbias: bias.map(|b| self.f64_like("dbias_bf16", b)).transpose()?,
        }))
    }

    fn bool(&self, name: &str) -> Result<Tensor<bool>, String> {
        let (shape, data) = self.raw(name, &[Dtype::BOOL, Dtype::U8])?;
        Ok(Tensor { data: fixtures::flags(data), shape })
    }

    fn lengths(&self, name: &str) -> Result<Vec<usize>, String> {
        let (shape, data) = self.raw(name, &[Dtype::I64])?;
        if shape.len() != 1 {
            return Err(format!("{}: tensor {name}: shape {shape:?}, expected rank 1", self.file));
        }
        fixtures::le_i64(data)
            .into_iter()
            .map(|x| usize::try_from(x).map_err(|_| format!("{}: tensor {name}: negative length {x}", self.file)))
            .collect()
    }
}

fn options(file: &str, meta: &HashMap<String, String>) -> Result<Options, String> {
    let get = |key: &str| meta.get(key).map(String::as_str).ok_or_else(|| format!("{file}: metadata {key} missing"));
    let bad =
        |key: &str, value: &str, expected: &str| format!("{file}: metadata {key} = {value:?}, expected {expected}");
    let float = |key: &str, none: &str| -> Result<Option<f64>, String> {
        match get(key)? {
            v if v == none => Ok(None),
            v => v.parse().map(Some).map_err(|_| bad(key, v, &format!("{none:?} or a number"))),
        }
    };
    let side = |key: &str| -> Result<Option<usize>, String> {
        match get(key)? {
            "none" => Ok(None),
            v => v.parse().map(Some).map_err(|_| bad(key, v, "\"none\" or a count")),
        }
    };
    let causal = match get("causal")? {
        "true" => true,
        "false" => false,
        v => return Err(bad("causal", v, "\"true\" or \"false\"")),
    };
    let align = match get("align")? {
        "top_left" => Align::TopLeft,
        "bottom_right" => Align::BottomRight,
        v => return Err(bad("align", v, "\"top_left\" or \"bottom_right\"")),
    };
    let (left, right) = (side("window_left")?, side("window_right")?);
    Ok(Options {
        scale: float("scale", "default")?,
        causal,
        align,
        window: (left.is_some() || right.is_some()).then_some(Window { left, right }),
        softcap: float("softcap", "none")?,
    })
}
