//! What every backward kernel shares: the gradients' container and the validation of the saved
//! forward results and the incoming gradient against the call's sizes.

use crate::alloc::{self, AllocError, ZeroBits};
use crate::error::{AttnError, Result};
use crate::output::Path;
use crate::problem::Dims;
use crate::view::View4;

/// Gradients of one attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnGrads<T> {
    /// `dq: [B, Hq, Lq, Dk]`.
    pub dq: Vec<T>,
    /// `dk: [B, Hkv, Lk, Dk]`, summed over the query heads of each key/value head.
    pub dk: Vec<T>,
    /// `dv: [B, Hkv, Lk, Dv]`, summed over the query heads of each key/value head.
    pub dv: Vec<T>,
    /// The bias's gradient in the bias's own (broadcast) shape, when asked for and a bias is given.
    pub dbias: Option<Vec<T>>,
    /// The gradient of the score modification's table, when it reads one.
    pub dtable: Option<Vec<T>>,
    /// The sinks' gradient `[Hq]` when the call has [sinks](crate::AttnParams::sinks):
    /// `dsink_h = −Σ_{b,i} p_sink,bhi · Δ_bhi` with `p_sink = exp(sink_h − lse)` and
    /// `Δ_i = Σ_j A_ij·dA_ij = dO_i·O_i` (dropout included: `O` holds the kept weights); 0 for a −∞
    /// sink.
    pub dsinks: Option<Vec<T>>,
}

impl<T: ZeroBits> AttnGrads<T> {
    /// Zeroed gradients for `d`, with a zeroed `dbias` of `bias_len` elements when given, a zeroed
    /// `dsinks: [Hq]` with `sinks`, and `dtable` of `table_len` when given (a table of 0 entries
    /// gets none), allocated fallibly ([`alloc::zeroed`]: large ones populated in parallel, no
    /// writing pass).
    pub fn zeros(
        d: &Dims,
        bias_len: Option<usize>,
        sinks: bool,
        table_len: Option<usize>,
    ) -> std::result::Result<Self, AllocError> {
        let zeros = |what, shape: &[usize]| alloc::zeroed(what, shape);
        Ok(Self {
            dq: zeros("gradient dq", &[d.b, d.hq, d.lq, d.dk])?,
            dk: zeros("gradient dk", &[d.b, d.hkv, d.lk, d.dk])?,
            dv: zeros("gradient dv", &[d.b, d.hkv, d.lk, d.dv])?,
            dbias: bias_len.map(|n| zeros("gradient dbias", &[n])).transpose()?,
            dtable: table_len.filter(|&n| n > 0).map(|n| zeros("gradient dtable", &[n])).transpose()?,
            dsinks: if sinks { Some(zeros("gradient dsinks", &[d.hq])?) } else { None },
        })
    }
}

/// What a backward needs from its forward, and the gradient arriving at the output.
#[derive(Debug, Clone, Copy)]
pub struct Saved<'a, T> {
    /// The forward's output `[B, Hq, Lq, Dv]` (fast kernels take `Σ_j A_ij·dA_ij` as `dO_i·O_i`;
    /// the reference computes it from its definition and only checks the shape).
    pub out: View4<'a, T>,
    /// The forward's log-sum-exp `[B, Hq, Lq]` (with sinks, the sink-inclusive one the forward
    /// returned).
    pub lse: &'a [T],
    /// The forward's [`lse_residue`](crate::AttnOutput::lse_residue) `[B, Hq, Lq]`, when at hand
    /// (`None` for a log-sum-exp from elsewhere: the fast backward's probabilities are then off by
    /// up to half an ulp of `|lse|` relative, a whole row alike). The reference recomputes the
    /// softmax from the scores and needs neither.
    pub lse_residue: Option<&'a [T]>,
    /// The flash path that scored the keys in the forward ([`AttnOutput::path`](crate::AttnOutput));
    /// `None`: the path the flash forward would choose for these sizes.
    pub forward_path: Option<Path>,
    /// The gradient of the output, `dO: [B, Hq, Lq, Dv]`.
    pub dout: View4<'a, T>,
    /// The gradients arriving at the forward's other outputs (none by default).
    pub side: SideGrads<'a, T>,
}

/// Gradients arriving at the forward's outputs other than `out`: the log-sum-exp and the weights.
///
/// Row `i`'s softmax gradient with them is
/// `dS_ij = A_ij·(dA_ij + dW_ij − Δ_i − ω_i + dlse_i)`, with `A` the weights before dropout,
/// `dA` the gradient reaching them through the output (dropout replayed), `Δ_i = Σ_j A_ij·dA_ij`,
/// `ω_i = Σ_j A_ij·dW_ij` (since `∂lse_i/∂s_ij = A_ij`, the log-sum-exp's gradient adds
/// `A_ij·dlse_i`). With sinks the sink-inclusive `lse` and weights are the ones meant, and the
/// sink's gradient becomes `−Σ_i p_sink,i·(Δ_i + ω_i − dlse_i)`. A fully masked row still gets 0.
#[derive(Debug, Clone, Copy)]
pub struct SideGrads<'a, T> {
    /// `dlse: [B, Hq, Lq]`.
    pub dlse: Option<&'a [T]>,
    /// The weights' gradient, with the weights the forward returned.
    pub dweights: Option<WeightsGrad<'a, T>>,
}

impl<T> Default for SideGrads<'_, T> {
    fn default() -> Self {
        Self { dlse: None, dweights: None }
    }
}

/// The softmax weights a forward returned (before dropout) and their gradient, both
/// `[B, Hq, Lq, Lk]`. Weights of masked keys are 0 and their gradients are never read.
#[derive(Debug, Clone, Copy)]
pub struct WeightsGrad<'a, T> {
    /// The weights `A`.
    pub weights: View4<'a, T>,
    /// Their gradient `dW`.
    pub grad: View4<'a, T>,
}

impl<T: Copy + Into<f64>> SideGrads<'_, T> {
    /// `ω_i − dlse_i` of row `(b, h, i)` of a call with `hq` heads of `lq` queries (see the type's
    /// header), summed in `f64`; terms whose weight is 0 (masked keys) are skipped.
    pub(crate) fn row_term(&self, [b, h, i]: [usize; 3], hq: usize, lq: usize) -> f64 {
        let omega = self.dweights.map_or(0.0, |wg| {
            let (w, g) = (wg.weights.row(b, h, i), wg.grad.row(b, h, i));
            w.iter().zip(g).filter(|(&w, _)| w.into() != 0.0).map(|(&w, &g)| w.into() * g.into()).sum()
        });
        omega - self.dlse.map_or(0.0, |x| x[(b * hq + h) * lq + i].into())
    }

    /// Whether any gradient arrives.
    pub fn any(&self) -> bool {
        self.dlse.is_some() || self.dweights.is_some()
    }
}

impl<'a, T: Copy> Saved<'a, T> {
    /// What the backward needs from `fwd`, whose output has shape `out_dims` (`[B, Hq, Lq, Dv]`),
    /// and the output's gradient `dout`.
    pub fn of(fwd: &'a crate::AttnOutput<T>, out_dims: [usize; 4], dout: View4<'a, T>) -> Result<Self> {
        Ok(Self {
            out: View4::contiguous("out", &fwd.out, out_dims)?,
            lse: &fwd.lse,
            lse_residue: Some(&fwd.lse_residue),
            forward_path: fwd.path,
            dout,
            side: SideGrads::default(),
        })
    }

    /// Checks every part against the call's sizes `d`.
    pub fn check(&self, d: &Dims) -> Result<()> {
        let lse = Some(self.lse.len());
        let lens = [
            ("lse", lse),
            ("lse_residue", self.lse_residue.map(<[T]>::len)),
            ("grad_lse", self.side.dlse.map(<[T]>::len)),
        ];
        for (name, len) in lens {
            if let Some(len) = len.filter(|&n| n != d.lse_len()) {
                return Err(AttnError::Layout {
                    tensor: name,
                    reason: format!("{len} elements, expected [B, Hq, Lq] = {}", d.lse_len()),
                });
            }
        }
        let rows = [("grad_out", self.dout), ("out", self.out)].map(|(n, v)| (n, v, "[B, Hq, Lq, Dv]", d.dv));
        let weights = self.side.dweights.map(|w| [("weights", w.weights), ("grad_weights", w.grad)]);
        let weights = weights.into_iter().flatten().map(|(n, v)| (n, v, "[B, Hq, Lq, Lk]", d.lk));
        for (name, v, what, last) in rows.into_iter().chain(weights) {
            let want = [d.b, d.hq, d.lq, last];
            if v.dims() != want {
                return Err(AttnError::Layout {
                    tensor: name,
                    reason: format!("shape {:?}, expected {what} = {:?}", v.dims(), want),
                });
            }
        }
        Ok(())
    }
}
