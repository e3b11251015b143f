//! The one conversion of [`SdpaOptions`] into the kernels' [`AttnParams`]. The kernels borrow
//! plain slices, so the mask, bias and sinks tensors are first copied to host memory in the form
//! the kernels read (keep flags; bias and sink values in the kernel's float type `T`), and the
//! parameters then borrow from that copy. [`sdpa_full`](crate::sdpa_full) computes through it, and so does any
//! caller of `attn_kernels` that starts from options (a test running the `f64` reference kernel,
//! say). [`SdpaOptions::keep_mask`] spells out, through the same conversion, which query may
//! attend which key.

use std::borrow::Cow;

use attn_kernels::{AttnParams, Broadcast, MaskSpec, Problem, ScoreFn};
use candle_core::{Device, Tensor, WithDType};

use crate::convert::float_values;
use crate::error::{AttnLibError, Result};
use crate::options::SdpaOptions;

/// An element-wise input in host memory: row-major values and the shape they broadcast from.
type HostPart<E> = Option<(Vec<E>, Vec<usize>)>;

/// The options of one call in the kernels' form: what [`KernelParams::attn_params`] borrows.
#[derive(Debug, Clone)]
pub struct KernelParams<'o, T> {
    opts: Cow<'o, SdpaOptions>,
    keep: HostPart<bool>,
    bias: HostPart<T>,
    sinks: Option<Vec<T>>,
    /// The score modification's table, always `f32` (the kernels read it so).
    table: Vec<f32>,
}

impl SdpaOptions {
    /// Reads the mask (as keep flags), the bias and the sinks (as `T`) into host memory for inputs
    /// `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`: mask and bias must have rank 1 to 4 and
    /// broadcast right-aligned to `[B, Hq, Lq, Lk]`, the sinks rank 1 (the broadcast and the
    /// sinks' length `Hq` are checked by the kernel, which knows the sizes). The bias and the
    /// sinks must have a float dtype.
    pub fn kernel_params<T: WithDType>(&self) -> Result<KernelParams<'_, T>> {
        let keep = match &self.mask {
            Some(m) => Some((m.keep_values()?, elementwise_shape("mask", m.shape())?)),
            None => None,
        };
        let bias = match &self.bias {
            Some(b) => Some((float_values::<T>("bias", b)?, elementwise_shape("bias", b.dims())?)),
            None => None,
        };
        let sinks = match &self.sinks {
            Some(s) if s.rank() != 1 => {
                return Err(AttnLibError::Shape {
                    tensor: "sinks",
                    found: s.dims().to_vec(),
                    expected: "rank 1 [Hq]".into(),
                })
            }
            Some(s) => Some(float_values::<T>("sinks", s)?),
            None => None,
        };
        let table = match self.score_mod.as_ref().and_then(|s| s.table.as_ref()) {
            Some(t) => float_values::<f32>("score_table", t)?,
            None => Vec::new(),
        };
        Ok(KernelParams { opts: Cow::Borrowed(self), keep, bias, sinks, table })
    }
}

impl SdpaOptions {
    /// The keep-mask `[B, Hq, Lq, Lk]` these options amount to for `q: [B, Hq, Lq, ·]` and keys
    /// `[B, ·, Lk, ·]`, as a `U8` CPU tensor (1 = the query may attend the key): the causal band or
    /// window under the alignment, the key lengths, the boolean mask, the bias's `−∞` entries and
    /// the block mask together. Its zeros are the cells whose weight masking sets to 0, as opposed to a weight that
    /// is merely tiny; dropout is not part of it. Fails as the call itself would on a mask, bias or
    /// key lengths that do not fit the sizes.
    pub fn keep_mask(&self, b: usize, hq: usize, lq: usize, lk: usize) -> Result<Tensor> {
        let host = self.kernel_params::<f32>()?;
        let params = host.attn_params()?;
        // One key/value head of width 1: only the sizes the masks depend on matter.
        let p = Problem::new([b, hq, lq, 1], [b, 1, lk, 1], [b, 1, lk, 1], &params)?;
        let mut keep = attn_kernels::alloc::filled("keep mask", &[b, hq, lq, lk], 0u8)?;
        for (row, flags) in keep.chunks_mut(lk.max(1)).take(b * hq * lq).enumerate() {
            let (bi, h, i) = (row / (hq * lq), row / lq % hq, row % lq);
            let (lo, hi) = p.key_range(bi, i);
            for (j, flag) in flags.iter_mut().enumerate().take(hi).skip(lo) {
                let kept = p.elem.keep.is_none_or(|m| m.at(bi, h, i, j));
                let finite_bias = p.elem.bias.is_none_or(|x| x.at(bi, h, i, j) != f32::NEG_INFINITY);
                let in_block = p.elem.block.is_none_or(|m| m.allows(bi, h, i, j));
                *flag = u8::from(kept && finite_bias && in_block);
            }
        }
        Ok(Tensor::from_vec(keep, (b, hq, lq, lk), &Device::Cpu)?)
    }
}

impl<T> KernelParams<'_, T> {
    /// The options these parameters were made from.
    pub(crate) fn options(&self) -> &SdpaOptions {
        &self.opts
    }

    /// The same parameters holding their own copy of the options (a cheap clone: tensors are
    /// shared), so they can outlive the caller's options, as the autograd op's do.
    pub(crate) fn into_owned(self) -> KernelParams<'static, T> {
        let KernelParams { opts, keep, bias, sinks, table } = self;
        KernelParams { opts: Cow::Owned(opts.into_owned()), keep, bias, sinks, table }
    }

    /// The kernels' parameters of the call, borrowing the host copies.
    pub fn attn_params(&self) -> Result<AttnParams<'_, T>> {
        // Every option named, so that a new one fails to compile here until it reaches the
        // kernels or is named as used elsewhere: the tensors through their host copies, `kernel`
        // and `return_weights` by the caller.
        let SdpaOptions {
            scale,
            causal,
            align,
            window,
            mask: _,
            bias: _,
            key_lengths,
            block_mask,
            softcap,
            dropout,
            sinks: _,
            score_mod,
            kernel: _,
            compute,
            return_weights: _,
        } = &*self.opts;
        Ok(AttnParams {
            scale: *scale,
            mask: MaskSpec {
                causal: *causal,
                window: *window,
                align: *align,
                key_lengths: key_lengths.as_deref(),
                keep: broadcast("mask", &self.keep)?,
                bias: broadcast("bias", &self.bias)?,
                block: block_mask.as_deref(),
            },
            softcap: *softcap,
            dropout: *dropout,
            score_mod: score_mod.as_ref().map(|s| ScoreFn { m: &*s.m, table: &self.table }),
            sinks: self.sinks.as_deref(),
            compute: *compute,
        })
    }
}

fn broadcast<'a, E>(name: &'static str, part: &'a HostPart<E>) -> Result<Option<Broadcast<'a, E>>> {
    Ok(match part {
        Some((data, shape)) => Some(Broadcast::new(name, data, shape)?),
        None => None,
    })
}

/// `shape` if it has rank 1 to 4.
fn elementwise_shape(name: &'static str, shape: &[usize]) -> Result<Vec<usize>> {
    if shape.is_empty() || shape.len() > 4 {
        return Err(AttnLibError::Shape {
            tensor: name,
            found: shape.to_vec(),
            expected: "rank 1 to 4, broadcastable to [B, Hq, Lq, Lk]".into(),
        });
    }
    Ok(shape.to_vec())
}
