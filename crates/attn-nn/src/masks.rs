//! The masks one attention module call takes, in PyTorch `nn.MultiheadAttention`'s vocabulary: a
//! key padding mask, an attention mask (boolean or additive) and causality. They are typed
//! ([`attn::Mask`] carries its polarity), so PyTorch's "true = masked" module masks
//! ([`Mask::block`]) and SDPA's "true = may attend" masks ([`Mask::keep`], [`attn::padding_mask`])
//! cannot be confused. [`AttnMasks::options`] turns them into the one [`SdpaOptions`] of the call.

use attn::{Align, Mask, Polarity, SdpaOptions};
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
    /// Which keys are padding: `[B, Lk]` or `[B, 1, 1, Lk]`, e.g. [`attn::padding_mask`]
    /// (`Mask::keep`, true = real token) or PyTorch's `key_padding_mask` (`Mask::block`).
    pub key_padding: Option<Mask>,
    /// The attention mask.
    pub attn: Option<AttnMask>,
    /// Causal masking, top-left aligned like PyTorch's `is_causal` (bottom-right when decoding
    /// through a KV cache, so the new queries sit at the end of the keys).
    pub causal: bool,
}

impl AttnMasks {
    /// Only causal masking.
    pub fn causal() -> Self {
        Self { causal: true, ..Self::default() }
    }

    /// Sets the key padding mask (`[B, Lk]` or `[B, 1, 1, Lk]`).
    pub fn key_padding(mut self, mask: Mask) -> Self {
        self.key_padding = Some(mask);
        self
    }

    /// Sets the attention mask.
    pub fn attn_mask(mut self, mask: AttnMask) -> Self {
        self.attn = Some(mask);
        self
    }

    /// `base` with these masks for a call of `[b, h, lq, lk]` scores; `decoding` selects
    /// bottom-right causal alignment. Shapes are checked here so an error names the mask.
    pub(crate) fn options(
        &self,
        module: &'static str,
        base: SdpaOptions,
        [b, h, lq, lk]: [usize; 4],
        decoding: bool,
    ) -> Result<SdpaOptions> {
        let mut opts = base.causal(self.causal).align(if decoding { Align::BottomRight } else { Align::TopLeft });
        let padding = self.key_padding.as_ref().map(|m| padding_4d(module, m, b, lk)).transpose()?;
        let (attn_bool, bias) = match &self.attn {
            None => (None, None),
            Some(AttnMask::Bool(m)) => (Some(with_tensor(m, attn_4d(module, m.tensor(), [b, h, lq, lk])?)), None),
            Some(AttnMask::Additive(t)) => (None, Some(attn_4d(module, t, [b, h, lq, lk])?)),
        };
        let mask = match (padding, attn_bool) {
            (Some(p), Some(a)) => Some(p.and(&a)?),
            (p, a) => p.or(a),
        };
        opts.mask = mask;
        opts.bias = bias;
        Ok(opts)
    }
}

/// The same polarity over another tensor.
fn with_tensor(m: &Mask, t: Tensor) -> Mask {
    match m.polarity() {
        Polarity::Keep => Mask::keep(t),
        Polarity::Block => Mask::block(t),
    }
}

/// A key padding mask as `[B, 1, 1, Lk]`.
fn padding_4d(module: &'static str, m: &Mask, b: usize, lk: usize) -> Result<Mask> {
    let t = m.tensor();
    match *t.dims() {
        [mb, ml] if mb == b && ml == lk => Ok(with_tensor(m, t.reshape((b, 1, 1, lk))?)),
        [mb, 1, 1, ml] if mb == b && ml == lk => Ok(m.clone()),
        _ => Err(NnError::Input {
            module,
            input: "key_padding_mask",
            found: t.dims().to_vec(),
            expected: format!("[B, Lk] = [{b}, {lk}] or [{b}, 1, 1, {lk}]"),
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
