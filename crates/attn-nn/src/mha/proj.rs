//! The four projections of multi-head attention under PyTorch `nn.MultiheadAttention`'s names and
//! initialisation, shared by [`super::MultiHeadAttention`] and [`crate::LinearAttention`] so both
//! load the same state dicts: `in_proj_weight [3E, E]` when queries, keys and values all have width
//! `E` and every head has its own keys, otherwise `q_proj_weight [E, E]`,
//! `k_proj_weight [Hkv·hd, kdim]`, `v_proj_weight [Hkv·hd, vdim]`; with `bias`,
//! `in_proj_bias [E + 2·Hkv·hd]`; `out_proj.weight [E, E]` and `out_proj.bias [E]`.

use candle_core::Tensor;
use candle_nn::{Init, VarBuilder};

use candle_core::DType;

use crate::error::{NnError, Result};
use crate::layout::Layout;
use crate::linear::Linear;

/// The widths of the projections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProjSizes {
    /// `E`: queries and outputs.
    pub e: usize,
    /// `Hkv·hd`: projected keys and values.
    pub kv: usize,
    /// Width of the keys fed in.
    pub kdim: usize,
    /// Width of the values fed in.
    pub vdim: usize,
    /// Whether the projections have biases.
    pub bias: bool,
}

/// `W_Q`, `W_K`, `W_V` and the output projection.
#[derive(Debug)]
pub(crate) struct Projections {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub out: Linear,
}

impl Projections {
    /// Loads (or, from a `VarMap`, creates with PyTorch's initialisation) the weights under `vb`.
    pub(crate) fn load(s: ProjSizes, vb: &VarBuilder) -> Result<Self> {
        let ProjSizes { e, kv, kdim, vdim, bias } = s;
        let xavier = |rows: usize, cols: usize| {
            let bound = (6.0 / (rows + cols) as f64).sqrt();
            Init::Uniform { lo: -bound, up: bound }
        };
        let (wq, wk, wv) = if kdim == e && vdim == e && kv == e {
            let w = vb.get_with_hints((3 * e, e), "in_proj_weight", xavier(3 * e, e))?;
            (w.narrow(0, 0, e)?, w.narrow(0, e, e)?, w.narrow(0, 2 * e, e)?)
        } else {
            (
                vb.get_with_hints((e, e), "q_proj_weight", xavier(e, e))?,
                vb.get_with_hints((kv, kdim), "k_proj_weight", xavier(kv, kdim))?,
                vb.get_with_hints((kv, vdim), "v_proj_weight", xavier(kv, vdim))?,
            )
        };
        let (bq, bk, bv, out) = if bias {
            let b = vb.get_with_hints(e + 2 * kv, "in_proj_bias", Init::Const(0.0))?;
            let out_w = vb.get_with_hints((e, e), "out_proj.weight", candle_nn::init::DEFAULT_KAIMING_UNIFORM)?;
            let out_b = vb.get_with_hints(e, "out_proj.bias", Init::Const(0.0))?;
            (
                Some(b.narrow(0, 0, e)?),
                Some(b.narrow(0, e, kv)?),
                Some(b.narrow(0, e + kv, kv)?),
                Linear::new(out_w, Some(out_b)),
            )
        } else {
            (None, None, None, Linear::load_no_bias(e, e, vb.pp("out_proj"))?)
        };
        Ok(Self { q: Linear::new(wq, bq), k: Linear::new(wk, bk), v: Linear::new(wv, bv), out })
    }
}

/// `x: [B, L, n·hd]` → `[B, n, L, hd]`.
pub(crate) fn split_heads(x: &Tensor, n: usize) -> Result<Tensor> {
    let (b, l, w) = x.dims3()?;
    Ok(x.reshape((b, l, n, w / n))?.transpose(1, 2)?)
}

/// A call's `key: [B, Lk, kdim]` and `value: [B, Lk, vdim]` laid out as `layout` (the query's), as
/// `[B, Lk, ·]`: refused, naming them, unless their widths are `kdim` and `vdim`, their dtype
/// `dtype`, their batch `b` (the query's) and their lengths equal.
pub(crate) fn key_value(
    module: &'static str,
    layout: Layout,
    (key, value): (&Tensor, &Tensor),
    (kdim, vdim): (usize, usize),
    dtype: DType,
    b: usize,
) -> Result<(Tensor, Tensor)> {
    let k = layout.expect(module, "key", key, kdim, dtype)?;
    let v = layout.expect(module, "value", value, vdim, dtype)?;
    let ((kb, lk, _), (vb, lv, _)) = (k.dims3()?, v.dims3()?);
    if kb != b || vb != b || lv != lk {
        return Err(NnError::Input {
            module,
            input: "key/value",
            found: [key.dims(), value.dims()].concat(),
            expected: format!("batch {b} like query and equal key/value lengths"),
        });
    }
    Ok((k, v))
}

/// Refuses `num_heads` not dividing `embed_dim`, or `hkv` key/value heads not dividing
/// `num_heads`, naming the field of `module`'s config.
pub(crate) fn check_heads(module: &'static str, embed_dim: usize, num_heads: usize, hkv: usize) -> Result<()> {
    let bad = |field, reason: String| Err(NnError::Config { module, field, reason });
    if num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
        return bad("num_heads", format!("{num_heads} does not divide embed_dim {embed_dim}"));
    }
    if hkv == 0 || !num_heads.is_multiple_of(hkv) {
        return bad("num_kv_heads", format!("{hkv} does not divide num_heads {num_heads}"));
    }
    Ok(())
}
