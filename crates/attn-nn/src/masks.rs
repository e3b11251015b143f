//! The masks one attention module call takes, in PyTorch `nn.MultiheadAttention`'s vocabulary: a
//! key padding mask, an attention mask (boolean or additive) and causality. They are typed
//! ([`attn::Mask`] carries its polarity), so PyTorch's "true = masked" module masks
//! ([`Mask::block`]) and SDPA's "true = may attend" masks ([`Mask::keep`], [`attn::padding_mask`])
//! cannot be confused. Each module turns them into the one [`SdpaOptions`] of its call.

use attn::{Align, Mask, SdpaOptions};
use candle_core::Tensor;

use crate::error::{NnError, Result};

/// An attention mask over `[Lq, Lk]`, optionally per batch and head.
#[derive(Debug, Clone)]
pub enum AttnMask {
    /// Boolean, with its polarity; `[Lq, Lk]`, `[B·H, Lq, Lk]` (PyTorch's 3-D form) or
    /// `[B, H|1, Lq, Lk]`.
    Bool(Mask),
    /// Additive float (`0` / `-inf`, or any bias such as ALiBi), shapes as for `Bool`.
    Additive(Tensor),
}

/// Every mask of one attention call; a key is attended to only if all of them allow it.
#[derive(Debug, Clone, Default)]
pub struct AttnMasks {
    /// Which keys are padding: `[B, Lk]`, `[B, 1, 1, Lk]` or, for an unbatched call, `[Lk]`.
    /// Boolean, e.g. [`attn::padding_mask`] (`Mask::keep`, true = real token) or PyTorch's
    /// `key_padding_mask` (`Mask::block`), or additive (a float tensor added to the scores, as
    /// PyTorch's float `key_padding_mask`).
    pub key_padding: Option<AttnMask>,
    /// The attention mask.
    pub attn: Option<AttnMask>,
    /// Causal masking, top-left aligned like PyTorch's `is_causal` (bottom-right when decoding
    /// through a KV cache, so the new queries sit at the end of the keys).
    pub causal: bool,
}

impl From<Mask> for AttnMask {
    fn from(m: Mask) -> Self {
        AttnMask::Bool(m)
    }
}

impl AttnMasks {
    /// Only causal masking.
    pub fn causal() -> Self {
        Self { causal: true, ..Self::default() }
    }

    /// Sets the key padding mask: a boolean [`Mask`] or an [`AttnMask::Additive`] float tensor,
    /// `[B, Lk]`, `[B, 1, 1, Lk]` or unbatched `[Lk]`.
    pub fn key_padding(mut self, mask: impl Into<AttnMask>) -> Self {
        self.key_padding = Some(mask.into());
        self
    }

    /// Sets the attention mask.
    pub fn attn_mask(mut self, mask: AttnMask) -> Self {
        self.attn = Some(mask);
        self
    }

    /// `base` with these masks for a call of `[b, h, lq, lk]` scores followed by `extra` keys that
    /// every query may attend (PyTorch's `add_bias_kv` and `add_zero_attn`, for which PyTorch
    /// pads its masks with an unmasked column; with them causality is applied as a mask over the
    /// `lk` keys only). `decoding` selects bottom-right causal alignment. Shapes are checked here
    /// so an error names the mask.
    pub(crate) fn options(
        &self,
        module: &'static str,
        base: SdpaOptions,
        [b, h, lq, lk]: [usize; 4],
        decoding: bool,
        extra: usize,
    ) -> Result<SdpaOptions> {
        let align = if decoding { Align::BottomRight } else { Align::TopLeft };
        let mut opts = base.causal(self.causal && extra == 0).align(align);
        let mut masks = Vec::new();
        let mut biases = Vec::new();
        match &self.key_padding {
            None => {}
            Some(AttnMask::Bool(m)) => masks.push(m.with_tensor(padding_4d(module, m.tensor(), b, lk)?)),
            Some(AttnMask::Additive(t)) => biases.push(padding_4d(module, t, b, lk)?),
        }
        match &self.attn {
            None => {}
            Some(AttnMask::Bool(m)) => masks.push(m.with_tensor(attn_4d(module, m.tensor(), [b, h, lq, lk])?)),
            Some(AttnMask::Additive(t)) => biases.push(attn_4d(module, t, [b, h, lq, lk])?),
        }
        if self.causal && extra > 0 {
            masks.push(Mask::window(lq, lk, None, Some(0), align)?);
        }
        let mut mask = None;
        for m in masks {
            mask = Some(match mask {
                None => m,
                Some(acc) => m.and(&acc)?,
            });
        }
        let mut bias: Option<Tensor> = None;
        for t in biases {
            bias = Some(match bias {
                None => t,
                Some(acc) => acc.broadcast_add(&t)?,
            });
        }
        opts.mask = match mask {
            Some(m) if extra > 0 => Some(Mask::keep(extend(&m.to_keep_tensor()?, extra, 1.0)?)),
            m => m,
        };
        opts.bias = bias.map(|t| extend(&t, extra, 0.0)).transpose()?;
        Ok(opts)
    }
}

impl AttnMasks {
    /// The masks of a call of `b` batch entries over `lk` keys as what linear attention takes:
    /// causality and, from a boolean key padding mask, the count of real keys per entry
    /// (`None` without padding). Refused, naming the mask: an attention mask, an additive key
    /// padding mask, or padding that is not at the end of a row.
    pub(crate) fn key_lengths(&self, module: &'static str, b: usize, lk: usize) -> Result<Option<Vec<usize>>> {
        if let Some(m) = &self.attn {
            let t = match m {
                AttnMask::Bool(m) => m.tensor(),
                AttnMask::Additive(t) => t,
            };
            return Err(NnError::Input {
                module,
                input: "attn_mask",
                found: t.dims().to_vec(),
                expected: "none: linear attention takes key padding and causality only".into(),
            });
        }
        let m = match &self.key_padding {
            None => return Ok(None),
            Some(AttnMask::Bool(m)) => m,
            Some(AttnMask::Additive(t)) => {
                return Err(NnError::Input {
                    module,
                    input: "key_padding_mask",
                    found: t.dims().to_vec(),
                    expected: "a boolean mask: linear attention cannot add a float bias to its scores".into(),
                })
            }
        };
        if lk == 0 {
            return Ok(Some(vec![0; b]));
        }
        let keep = m.with_tensor(padding_4d(module, m.tensor(), b, lk)?).to_keep_tensor()?;
        let keep = keep.flatten_all()?.to_vec1::<u8>()?;
        let mut lens = Vec::with_capacity(b);
        for (i, row) in keep.chunks(lk.max(1)).take(b).enumerate() {
            let len = row.iter().position(|&x| x == 0).unwrap_or(row.len());
            if let Some(j) = row[len..].iter().position(|&x| x != 0) {
                return Err(NnError::Input {
                    module,
                    input: "key_padding_mask",
                    found: m.tensor().dims().to_vec(),
                    expected: format!(
                        "padding at the end of each row only (row {i}: padding at {len}, a real key at {})",
                        len + j
                    ),
                });
            }
            lens.push(len);
        }
        Ok(Some(lens))
    }
}

/// `t` with `extra` more entries of value `fill` along its last (key) dimension.
fn extend(t: &Tensor, extra: usize, fill: f64) -> Result<Tensor> {
    if extra == 0 {
        return Ok(t.clone());
    }
    let mut dims = t.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = extra;
    }
    let pad = (Tensor::ones(dims, t.dtype(), t.device())? * fill)?;
    Ok(Tensor::cat(&[t, &pad], t.rank() - 1)?)
}

/// A key padding mask (boolean or additive) as `[B, 1, 1, Lk]`.
fn padding_4d(module: &'static str, t: &Tensor, b: usize, lk: usize) -> Result<Tensor> {
    match *t.dims() {
        [mb, ml] if mb == b && ml == lk => Ok(t.reshape((b, 1, 1, lk))?),
        [ml] if b == 1 && ml == lk => Ok(t.reshape((1, 1, 1, lk))?),
        [mb, 1, 1, ml] if mb == b && ml == lk => Ok(t.clone()),
        _ => Err(NnError::Input {
            module,
            input: "key_padding_mask",
            found: t.dims().to_vec(),
            expected: format!("[B, Lk] = [{b}, {lk}], [{b}, 1, 1, {lk}] or, unbatched, [Lk]"),
        }),
    }
}

/// An attention mask as rank 2 `[Lq, Lk]` or rank 4 `[B|1, H|1, Lq, Lk]`.
fn attn_4d(module: &'static str, t: &Tensor, [b, h, lq, lk]: [usize; 4]) -> Result<Tensor> {
    let ok = |d: usize, want: usize| d == want || d == 1;
    match *t.dims() {
        [q, k] if q == lq && k == lk => Ok(t.clone()),
        [bh, q, k] if bh == b * h && q == lq && k == lk => Ok(t.reshape((b, h, lq, lk))?),
        [tb, th, q, k] if ok(tb, b) && ok(th, h) && q == lq && k == lk => Ok(t.clone()),
        _ => Err(NnError::Input {
            module,
            input: "attn_mask",
            found: t.dims().to_vec(),
            expected: format!(
                "[Lq, Lk] = [{lq}, {lk}], [B·H, Lq, Lk] = [{}, {lq}, {lk}] or [B|1, H|1, {lq}, {lk}]",
                b * h
            ),
        }),
    }
}
