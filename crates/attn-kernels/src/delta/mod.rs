//! The gated delta rule (DeltaNet's delta rule with a decay: Gated DeltaNet, Yang, Kautz &
//! Hatamizadeh 2025; Kimi Delta Attention's per-channel decay), in fla's conventions, which the
//! models call. Per batch and value head, a state `S ∈ R^{Dk×Dv}` is decayed, read and corrected at
//! every token `t`:
//!
//! `S' = diag(α_t)·S_{t−1}`, `u_t = β_t·(v_t − S'ᵀk_t)`, `S_t = S' + k_t u_tᵀ`, `o_t = S_tᵀ(scale·q_t)`
//!
//! — i.e. `S_t = (I − β_t k_t k_tᵀ)·α_t S_{t−1} + β_t k_t v_tᵀ` — with `α_t = exp(g_t)`, one value
//! per head ([`Gate::Scalar`], Gated DeltaNet) or one per key channel ([`Gate::Channel`], KDA), and
//! `g_t ≤ 0`. `scale` is `1/√Dk` unless given; with [`DeltaParams::l2norm_qk`] `q` and `k` are first
//! divided by `√(Σx² + 1e-6)` (transformers' `l2norm`, fla's `use_qk_l2norm_in_kernel`).
//!
//! Layouts (fla's): `q, k: [B, T, Hk, Dk]`, `v: [B, T, Hv, Dv]`, `beta: [B, T, Hv]`, `g: [B, T, Hv]`
//! or `[B, T, Hv, Dk]`, the initial and final states `[N, Hv, Dk, Dv]` for `N` sequences (the `B`
//! rows, or with `B = 1` the packed sequences of [`DeltaInputs::cu_seqlens`]); `Hv` a multiple of
//! `Hk` (value head `h` reads key head `h / (Hv/Hk)`, as Qwen3-Next groups them).
//!
//! - [`delta_rule`] / [`delta_rule_backward`] (`chunk`): the fast forward and backward in `f32`, in
//!   chunks of [`CHUNK`] tokens whose products are matrix products.
//! - [`delta_rule_reference`] / [`delta_rule_reference_backward`] (`reference`): the token-by-token
//!   recurrence and its exact reverse-mode derivative, generic over `f32`/`f64` (the `f64` one is
//!   the oracle; the `f32` one is the recurrent decode, one token in `O(Dk·Dv)`).

mod chunk;
mod reference;

pub use chunk::{delta_rule, delta_rule_backward, CHUNK};
pub use reference::{delta_rule_reference, delta_rule_reference_backward};

use crate::error::{AttnError, Result};
use crate::reference::Real;

/// The epsilon of the L2 normalisation of `q` and `k` (transformers' `l2norm`).
pub const L2NORM_EPS: f64 = 1e-6;

/// How the decay applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Gate {
    /// One log decay per token and value head, `g: [B, T, Hv]` (Gated DeltaNet).
    #[default]
    Scalar,
    /// One log decay per token, value head and key channel, `g: [B, T, Hv, Dk]`: row `i` of the
    /// state decays by `exp(g_i)` (Kimi Delta Attention).
    Channel,
}

/// Sizes of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaDims {
    /// Batch.
    pub b: usize,
    /// Tokens.
    pub t: usize,
    /// Key (and query) heads.
    pub hk: usize,
    /// Value heads, a multiple of `hk`.
    pub hv: usize,
    /// Key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
}

impl DeltaDims {
    /// Elements of `q` and `k`.
    pub fn qk_len(&self) -> usize {
        self.b * self.t * self.hk * self.dk
    }

    /// Elements of `v` and of the output.
    pub fn v_len(&self) -> usize {
        self.b * self.t * self.hv * self.dv
    }

    /// Elements of `beta` (and of a scalar `g`).
    pub fn beta_len(&self) -> usize {
        self.b * self.t * self.hv
    }

    /// Elements of `g` for `gate`.
    pub fn g_len(&self, gate: Gate) -> usize {
        match gate {
            Gate::Scalar => self.beta_len(),
            Gate::Channel => self.beta_len() * self.dk,
        }
    }

    /// Elements of the states of `sequences` sequences, `[N, Hv, Dk, Dv]` (`N` is `B`, or the
    /// packed sequences' count: [`DeltaInputs::sequences`]).
    pub fn state_len(&self, sequences: usize) -> usize {
        sequences * self.hv * self.dk * self.dv
    }
}

/// Options of a call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeltaParams {
    /// Multiplier of the queries; `None` means `1/√Dk`. Finite.
    pub scale: Option<f64>,
    /// L2-normalise `q` and `k` inside the kernel (fla's `use_qk_l2norm_in_kernel`).
    pub l2norm_qk: bool,
    /// How `g` decays the state.
    pub gate: Gate,
}

/// The inputs of a call, row-major in the module header's layouts.
#[derive(Debug, Clone, Copy)]
pub struct DeltaInputs<'a, T> {
    /// `[B, T, Hk, Dk]`.
    pub q: &'a [T],
    /// `[B, T, Hk, Dk]`.
    pub k: &'a [T],
    /// `[B, T, Hv, Dv]`.
    pub v: &'a [T],
    /// Log decays, `≤ 0`: `[B, T, Hv]` or, with [`Gate::Channel`], `[B, T, Hv, Dk]`.
    pub g: &'a [T],
    /// Step sizes in `[0, 2]`, `[B, T, Hv]` (above 1 the step gives the state's transition a
    /// negative eigenvalue, as OLMo-hybrid's `linear_allow_neg_eigval` does with `2·sigmoid`).
    pub beta: &'a [T],
    /// `[N, Hv, Dk, Dv]`; zero when `None`.
    pub initial_state: Option<&'a [T]>,
    /// Packed sequences (fla's `cu_seqlens`): with `B = 1`, sequence `n` is tokens
    /// `cu_seqlens[n]..cu_seqlens[n + 1]` and starts from its own state; `None`: the `B` rows of
    /// the batch are the sequences.
    pub cu_seqlens: Option<&'a [usize]>,
}

impl<T> DeltaInputs<'_, T> {
    /// `N`, the number of sequences: `B`, or `cu_seqlens.len() − 1`.
    pub fn sequences(&self, d: &DeltaDims) -> usize {
        self.cu_seqlens.map_or(d.b, |c| c.len().saturating_sub(1))
    }
}

/// What the forward returns.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaOutput<T> {
    /// `o: [B, T, Hv, Dv]`.
    pub out: Vec<T>,
    /// The state after each sequence's last token, `[N, Hv, Dk, Dv]`.
    pub final_state: Vec<T>,
}

/// Gradients of every input, in the inputs' layouts.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaGrads<T> {
    /// `[B, T, Hk, Dk]`.
    pub dq: Vec<T>,
    /// `[B, T, Hk, Dk]`.
    pub dk: Vec<T>,
    /// `[B, T, Hv, Dv]`.
    pub dv: Vec<T>,
    /// `g`'s layout.
    pub dg: Vec<T>,
    /// `[B, T, Hv]`.
    pub dbeta: Vec<T>,
    /// `[N, Hv, Dk, Dv]` (zeros when no initial state was given: the gradient of a zero state).
    pub dinitial_state: Vec<T>,
}

/// Refuses a tensor of `found` elements where the call's sizes need `expected`.
pub(crate) fn len(tensor: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(AttnError::DimMismatch { tensor, dim: "length", expected, found })
    }
}

/// Checks the inputs against `d` and `p`: lengths, head grouping, packed sequences, `g ≤ 0`,
/// `β ∈ [0, 2]`, a finite scale; returns the scale.
pub(crate) fn check<T: Real>(d: &DeltaDims, x: &DeltaInputs<T>, p: &DeltaParams) -> Result<f64> {
    if d.hk == 0 || !d.hv.is_multiple_of(d.hk) {
        return Err(AttnError::Heads(format!(
            "v has {} heads, not a multiple of the {} key heads (at least 1)",
            d.hv, d.hk
        )));
    }
    len("q", d.qk_len(), x.q.len())?;
    len("k", d.qk_len(), x.k.len())?;
    len("v", d.v_len(), x.v.len())?;
    len("g", d.g_len(p.gate), x.g.len())?;
    len("beta", d.beta_len(), x.beta.len())?;
    if let Some(cu) = x.cu_seqlens {
        let bad = |reason: String| Err(AttnError::Param { field: "cu_seqlens", reason });
        if d.b != 1 {
            return bad(format!("packed sequences need a batch of 1, found {}", d.b));
        }
        if cu.first() != Some(&0) || cu.last() != Some(&d.t) {
            return bad(format!("{cu:?} must start at 0 and end at the {} tokens", d.t));
        }
        if let Some(w) = cu.windows(2).position(|w| w[1] < w[0]) {
            return bad(format!("entry {} ({}) is below entry {w} ({})", w + 1, cu[w + 1], cu[w]));
        }
    }
    if let Some(s) = x.initial_state {
        len("initial_state", d.state_len(x.sequences(d)), s.len())?;
    }
    if let Some((at, g)) = x.g.iter().enumerate().find(|(_, g)| g.is_nan() || **g > T::zero()) {
        return Err(AttnError::Param { field: "g", reason: format!("entry {at} is {g:?}; expected a log decay <= 0") });
    }
    let two = T::one() + T::one();
    if let Some((at, b)) = x.beta.iter().enumerate().find(|(_, b)| b.is_nan() || **b < T::zero() || **b > two) {
        return Err(AttnError::Param {
            field: "beta",
            reason: format!("entry {at} is {b:?}; expected 0 <= beta <= 2"),
        });
    }
    let scale = p.scale.unwrap_or(1.0 / (d.dk.max(1) as f64).sqrt());
    if !scale.is_finite() {
        return Err(AttnError::Param { field: "scale", reason: format!("{scale} is not finite") });
    }
    Ok(scale)
}
