//! The options of one call as the Python side hands them over (a `bool` keep-mask and a float
//! bias as C-contiguous NumPy arrays of rank 1 to 4, key lengths, window, alignment, scalars),
//! borrowed into the kernels' [`AttnParams`].

use attn_kernels::{Align, AttnParams, Broadcast, Dropout, MaskSpec, Window};
use numpy::{Element, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::views::value_error;

/// Options shared by the forward and the backward, owned where small and borrowed where large.
/// A Python `dict` with these keys (see `attn/_args.py`).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct Options<'py> {
    /// Keep-mask, `true` = may attend, rank 1 to 4, broadcast to `[B, Hq, Lq, Lk]`.
    pub keep: Option<PyReadonlyArrayDyn<'py, bool>>,
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
}

/// A borrowed NumPy array of rank 1 to 4 as a contiguous slice and its shape.
fn contiguous<'a, T: Element>(name: &'static str, a: &'a PyReadonlyArrayDyn<'_, T>) -> PyResult<Broadcast<'a, T>> {
    let data = a
        .as_slice()
        .map_err(|_| PyValueError::new_err(format!("{name}: must be C-contiguous (the Python wrapper copies it)")))?;
    Broadcast::new(name, data, a.shape()).map_err(value_error)
}

impl<'py> Options<'py> {
    /// The bias as an array of `T`, when there is one.
    pub(crate) fn bias_array<T: Element>(&self) -> PyResult<Option<PyReadonlyArrayDyn<'py, T>>> {
        self.bias
            .as_ref()
            .map(|b| {
                b.extract().map_err(|_| {
                    pyo3::exceptions::PyTypeError::new_err(format!(
                        "attn_mask: a float mask must have the queries' compute dtype ({})",
                        std::any::type_name::<T>()
                    ))
                })
            })
            .transpose()
    }

    /// The kernels' parameters, borrowing the mask, `bias` (this call's [`Options::bias_array`])
    /// and the key lengths.
    pub(crate) fn params<'a, T: Element + Default>(
        &'a self,
        bias: Option<&'a PyReadonlyArrayDyn<'py, T>>,
    ) -> PyResult<AttnParams<'a, T>> {
        let keep = self.keep.as_ref().map(|m| contiguous("attn_mask", m)).transpose()?;
        let bias = bias.map(|b| contiguous("attn_mask", b)).transpose()?;
        let dropout = (self.dropout_p != 0.0).then_some(Dropout { p: self.dropout_p, seed: self.seed });
        Ok(AttnParams {
            scale: self.scale,
            mask: MaskSpec {
                causal: self.causal,
                window: self.window.map(|(left, right)| Window { left, right }),
                align: if self.bottom_right { Align::BottomRight } else { Align::TopLeft },
                key_lengths: self.key_lengths.as_deref(),
                keep,
                bias,
                block: None,
            },
            softcap: self.softcap,
            dropout,
            ..AttnParams::default()
        })
    }
}
