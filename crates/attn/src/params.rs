//! The one conversion of [`SdpaOptions`] into the kernels' [`AttnParams`]. The kernels borrow
//! plain slices, so the mask and bias tensors are first copied to host memory in the form the
//! kernels read (keep flags; bias values in the kernel's float type `T`), and the parameters then
//! borrow from that copy. [`sdpa_full`](crate::sdpa_full) computes through it, and so does any
//! caller of `attn_kernels` that starts from options (a test running the `f64` reference kernel,
//! say).

use attn_kernels::{AttnParams, Broadcast, MaskSpec};
use candle_core::WithDType;

use crate::convert::float_values;
use crate::error::{AttnLibError, Result};
use crate::options::SdpaOptions;

/// An element-wise input in host memory: row-major values and the shape they broadcast from.
type HostPart<E> = Option<(Vec<E>, Vec<usize>)>;

/// The options of one call in the kernels' form: what [`KernelParams::attn_params`] borrows.
#[derive(Debug, Clone)]
pub struct KernelParams<'o, T> {
    opts: &'o SdpaOptions,
    keep: HostPart<bool>,
    bias: HostPart<T>,
}

impl SdpaOptions {
    /// Reads the mask (as keep flags) and the bias (as `T`) into host memory for inputs
    /// `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`: both must have rank 1 to 4 and broadcast
    /// right-aligned to `[B, Hq, Lq, Lk]` (the broadcast itself is checked by the kernel, which
    /// knows the sizes). The bias must have a float dtype.
    pub fn kernel_params<T: WithDType>(&self) -> Result<KernelParams<'_, T>> {
        let keep = match &self.mask {
            Some(m) => Some((m.keep_values()?, elementwise_shape("mask", m.shape())?)),
            None => None,
        };
        let bias = match &self.bias {
            Some(b) => Some((float_values::<T>("bias", b)?, elementwise_shape("bias", b.dims())?)),
            None => None,
        };
        Ok(KernelParams { opts: self, keep, bias })
    }
}

impl<T> KernelParams<'_, T> {
    /// The kernels' parameters of the call, borrowing the host copies.
    pub fn attn_params(&self) -> Result<AttnParams<'_, T>> {
        let o = self.opts;
        Ok(AttnParams {
            scale: o.scale,
            mask: MaskSpec {
                causal: o.causal,
                window: o.window,
                align: o.align,
                key_lengths: o.key_lengths.as_deref(),
                keep: broadcast("mask", &self.keep)?,
                bias: broadcast("bias", &self.bias)?,
            },
            softcap: o.softcap,
            dropout: o.dropout,
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
