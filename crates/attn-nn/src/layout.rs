//! PyTorch's layouts of a sequence input `[.., E]`: batch first `[B, L, E]` (`batch_first=True`),
//! sequence first `[L, B, E]` (PyTorch's default, `batch_first=False`) and unbatched `[L, E]`.
//! A module reads the layout of its first input ([`Layout::of`]), checks the others against it
//! ([`Layout::expect`]), computes on `[B, L, E]` and returns its outputs in the same layout.

use candle_core::{DType, Tensor};

use crate::error::{expect_dtype, NnError, Result};

/// How one call's sequence inputs are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// `[B, L, E]`.
    BatchFirst,
    /// `[L, B, E]`.
    SeqFirst,
    /// `[L, E]` (one sequence).
    Unbatched,
}

impl Layout {
    /// The layout of `t` (rank 3 per `batch_first`, rank 2 unbatched), checking its width and
    /// dtype.
    pub(crate) fn of(
        module: &'static str,
        input: &'static str,
        t: &Tensor,
        width: usize,
        dtype: DType,
        batch_first: bool,
    ) -> Result<Self> {
        let layout = match (t.dims(), batch_first) {
            ([_, _, e], true) if *e == width => Layout::BatchFirst,
            ([_, _, e], false) if *e == width => Layout::SeqFirst,
            ([_, e], _) if *e == width => Layout::Unbatched,
            _ => {
                let batched = if batch_first { format!("[B, L, {width}]") } else { format!("[L, B, {width}]") };
                return Err(NnError::Input {
                    module,
                    input,
                    found: t.dims().to_vec(),
                    expected: format!("{batched} or unbatched [L, {width}]"),
                });
            }
        };
        expect_dtype(module, input, t, dtype)?;
        Ok(layout)
    }

    /// Checks that `t` has this layout (as PyTorch, every input of a call is batched or none),
    /// width `width` and dtype `dtype`; returns it as `[B, L, E]`.
    pub(crate) fn expect(
        self,
        module: &'static str,
        input: &'static str,
        t: &Tensor,
        width: usize,
        dtype: DType,
    ) -> Result<Tensor> {
        let batch_first = self != Layout::SeqFirst;
        let found = Self::of(module, input, t, width, dtype, batch_first)?;
        if found != self {
            let expected = if self == Layout::Unbatched {
                "unbatched like the first input"
            } else {
                "batched like the first input"
            };
            return Err(NnError::Input { module, input, found: t.dims().to_vec(), expected: expected.into() });
        }
        self.to_bld(t)
    }

    /// `t` in this layout as `[B, L, E]`.
    pub(crate) fn to_bld(self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Layout::BatchFirst => t.clone(),
            Layout::SeqFirst => t.transpose(0, 1)?,
            Layout::Unbatched => t.unsqueeze(0)?,
        })
    }

    /// `t: [B, L, E]` back in this layout.
    pub(crate) fn restore(self, t: Tensor) -> Result<Tensor> {
        Ok(match self {
            Layout::BatchFirst => t,
            Layout::SeqFirst => t.transpose(0, 1)?,
            Layout::Unbatched => t.squeeze(0)?,
        })
    }

    /// Attention weights `[B, ..]` as returned in this layout: without the batch dimension when
    /// unbatched, as they are otherwise (PyTorch returns them batch first whatever `batch_first`).
    pub(crate) fn weight(self, w: Tensor) -> Result<Tensor> {
        Ok(if self == Layout::Unbatched { w.squeeze(0)? } else { w })
    }

    /// [`Self::weight`] of weights when there are any.
    pub(crate) fn weights(self, w: Option<Tensor>) -> Result<Option<Tensor>> {
        w.map(|w| self.weight(w)).transpose()
    }
}

/// What the sequence inputs of a Transformer layer or stack must be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeqInputs {
    /// The module, for errors.
    pub module: &'static str,
    /// `d_model`.
    pub width: usize,
    /// The weights' dtype.
    pub dtype: DType,
    /// PyTorch's `batch_first`.
    pub batch_first: bool,
}

impl SeqInputs {
    /// The layout of the call's first input `t`, named `input`.
    pub(crate) fn layout(&self, input: &'static str, t: &Tensor) -> Result<Layout> {
        Layout::of(self.module, input, t, self.width, self.dtype, self.batch_first)
    }

    /// Another input `t` of a call laid out as `layout`, as `[B, L, E]`.
    pub(crate) fn expect(&self, layout: Layout, input: &'static str, t: &Tensor) -> Result<Tensor> {
        layout.expect(self.module, input, t, self.width, self.dtype)
    }
}
