//! The options of one call as the Python side hands them over (a `bool` keep-mask and a float
//! bias as C-contiguous DLPack capsules of rank 1 to 4, sink logits `[Hq]`, key lengths, window,
//! alignment, scalars, the products' precision), borrowed into the kernels' [`AttnParams`].

use attn_kernels::{Align, AttnParams, Dropout, MaskSpec, Precision, Window};
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, Elem};
use crate::views::broadcast;

/// Options shared by the forward and the backward, owned where small and borrowed where large.
/// A Python `dict` with these keys (see `attn/_args.py`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Options<'py> {
    /// Keep-mask (`bool`, `true` = may attend), rank 1 to 4, broadcast to `[B, Hq, Lq, Lk]`.
    pub keep: Option<Bound<'py, PyAny>>,
    /// Additive bias in the compute type (checked by [`Options::params`]), rank 1 to 4.
    pub bias: Option<Bound<'py, PyAny>>,
    pub causal: bool,
    /// `(left, right)`, `None` on a side = unbounded.
    pub window: Option<(Option<usize>, Option<usize>)>,
    pub bottom_right: bool,
    /// Valid keys per batch, `[B]`.
    pub key_lengths: Option<Vec<usize>>,
    pub scale: Option<f64>,
    pub softcap: Option<f64>,
    pub dropout_p: f32,
    pub seed: u64,
    /// bfloat16 products with f32 accumulation ([`Precision::Bf16`]) in the fast kernel.
    pub bf16_products: bool,
    /// Sink logits `[Hq]` in the compute type (gpt-oss's learned sinks), C-contiguous.
    pub sinks: Option<Bound<'py, PyAny>>,
}

/// The masks of one call, borrowed from their capsules.
pub(crate) struct Masks<'a> {
    keep: Option<Borrowed<'a>>,
    bias: Option<Borrowed<'a>>,
    sinks: Option<Borrowed<'a>>,
}

fn read<'a>(name: &'static str, m: &'a Option<Bound<'_, PyAny>>) -> PyResult<Option<Borrowed<'a>>> {
    m.as_ref().map(|m| Borrowed::new(name, m)).transpose()
}

impl<'py> Options<'py> {
    /// The masks' capsules, read.
    pub(crate) fn masks(&self) -> PyResult<Masks<'_>> {
        Ok(Masks {
            keep: read("attn_mask", &self.keep)?,
            bias: read("attn_mask", &self.bias)?,
            sinks: read("sinks", &self.sinks)?,
        })
    }

    /// The kernels' parameters in compute type `T`, borrowing the masks and the key lengths.
    pub(crate) fn params<'a, T: Elem + Default>(&'a self, masks: &Masks<'a>) -> PyResult<AttnParams<'a, T>> {
        // Both sides spelled out, so that a new key here or a new kernel option fails to compile
        // rather than doing nothing from Python. Score modifications are Rust closures and block
        // masks Rust values: Python hands neither.
        let Options {
            keep: _,
            bias: _,
            causal,
            window,
            bottom_right,
            key_lengths,
            scale,
            softcap,
            dropout_p,
            seed,
            bf16_products,
            sinks: _,
        } = self;
        let keep = masks.keep.as_ref().map(broadcast::<bool>).transpose()?;
        let bias = masks.bias.as_ref().map(broadcast::<T>).transpose()?;
        let dropout = (*dropout_p != 0.0).then_some(Dropout { p: *dropout_p, seed: *seed });
        Ok(AttnParams {
            scale: *scale,
            mask: MaskSpec {
                causal: *causal,
                window: window.map(|(left, right)| Window { left, right }),
                align: if *bottom_right { Align::BottomRight } else { Align::TopLeft },
                key_lengths: key_lengths.as_deref(),
                keep,
                bias,
                block: None,
            },
            softcap: *softcap,
            dropout,
            compute: if *bf16_products { Precision::Bf16 } else { Precision::F32 },
            sinks: masks.sinks.as_ref().map(|s| s.contiguous::<T>()).transpose()?,
            score_mod: None,
        })
    }
}
