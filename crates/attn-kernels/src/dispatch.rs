//! The public entry point for `f32` attention: picks a kernel ([`Kernel::Auto`] takes the fastest
//! path this CPU supports; [`Kernel::Reference`] the readable oracle) and accepts key/value tensors
//! stored as `f32`, `f16` or `bf16` (always accumulated in `f32`).

use half::{bf16, f16};

use crate::alloc;
use crate::error::{AttnError, Result};
use crate::flash::{self, BackwardTuning, Tuning};
use crate::grad::{AttnGrads, Saved};
use crate::output::AttnOutput;
use crate::problem::AttnParams;
use crate::problem::Problem;
use crate::reference::{reference, reference_backward};
use crate::view::View4;

/// Re-exported so that `attn_kernels::dispatch::Isa`, its path before it moved to the SIMD layer,
/// keeps working.
pub use crate::simd::Isa;

/// Which kernel computes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernel {
    /// The readable reference kernel in `f32`.
    Reference,
    /// The fastest available kernel for this CPU and call.
    #[default]
    Auto,
    /// The tiled online-softmax kernel with a given instruction set.
    Flash(Isa),
}

impl Kernel {
    /// Every kernel, available on this CPU or not.
    pub const ALL: [Kernel; 5] = [
        Kernel::Reference,
        Kernel::Auto,
        Kernel::Flash(Isa::Avx512),
        Kernel::Flash(Isa::Avx2),
        Kernel::Flash(Isa::Portable),
    ];

    /// Whether this CPU can run the kernel.
    pub fn is_available(self) -> bool {
        match self {
            Kernel::Flash(isa) => isa.is_available(),
            Kernel::Reference | Kernel::Auto => true,
        }
    }

    /// The flash instruction set this kernel runs on this CPU (`None` for the reference): the one
    /// place where a kernel's availability is checked before a call.
    pub fn flash_isa(self) -> Result<Option<Isa>> {
        match self {
            Kernel::Reference => Ok(None),
            Kernel::Auto => Ok(Some(Isa::best())),
            Kernel::Flash(isa) if isa.is_available() => Ok(Some(isa)),
            Kernel::Flash(isa) => Err(AttnError::Param { field: "kernel", reason: format!("this CPU lacks {isa:?}") }),
        }
    }

    /// The kernel that computes a call of this one on this CPU: [`Kernel::Auto`] resolves to the
    /// flash kernel of [`Isa::best`], the others to themselves (an unavailable instruction set is
    /// refused as in [`Kernel::flash_isa`]).
    pub fn resolve(self) -> Result<Kernel> {
        Ok(self.flash_isa()?.map_or(Kernel::Reference, Kernel::Flash))
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Reference => "reference",
            Kernel::Auto => "auto",
            Kernel::Flash(Isa::Avx512) => "flash-avx512",
            Kernel::Flash(Isa::Avx2) => "flash-avx2",
            Kernel::Flash(Isa::Portable) => "flash-portable",
        }
    }
}

impl std::str::FromStr for Kernel {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Kernel::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
            format!("unknown kernel '{s}', expected one of: {}", names.join(", "))
        })
    }
}

/// A key or value tensor `[B, Hkv, Lk, D]` in one of the supported storage types.
#[derive(Debug, Clone, Copy)]
pub enum KvView<'a> {
    /// Single precision.
    F32(View4<'a, f32>),
    /// IEEE half precision.
    F16(View4<'a, f16>),
    /// bfloat16.
    Bf16(View4<'a, bf16>),
}

impl<'a> KvView<'a> {
    /// `[B, Hkv, Lk, D]`.
    pub fn dims(&self) -> [usize; 4] {
        match self {
            KvView::F32(v) => v.dims(),
            KvView::F16(v) => v.dims(),
            KvView::Bf16(v) => v.dims(),
        }
    }

    /// A contiguous `f32` copy, `[B, Hkv, Lk, D]`, named `what` if it cannot be allocated.
    pub fn to_f32(&self, what: &'static str) -> Result<Vec<f32>> {
        let [b, h, l, _] = self.dims();
        let mut out = alloc::with_capacity(what, &self.dims())?;
        for bi in 0..b {
            for hi in 0..h {
                for li in 0..l {
                    match self {
                        KvView::F32(v) => out.extend_from_slice(v.row(bi, hi, li)),
                        KvView::F16(v) => out.extend(v.row(bi, hi, li).iter().map(|x| x.to_f32())),
                        KvView::Bf16(v) => out.extend(v.row(bi, hi, li).iter().map(|x| x.to_f32())),
                    }
                }
            }
        }
        Ok(out)
    }
}

impl<'a> From<View4<'a, f32>> for KvView<'a> {
    fn from(v: View4<'a, f32>) -> Self {
        KvView::F32(v)
    }
}
impl<'a> From<View4<'a, f16>> for KvView<'a> {
    fn from(v: View4<'a, f16>) -> Self {
        KvView::F16(v)
    }
}
impl<'a> From<View4<'a, bf16>> for KvView<'a> {
    fn from(v: View4<'a, bf16>) -> Self {
        KvView::Bf16(v)
    }
}

/// Attention in `f32`. `q: [B, Hq, Lq, Dk]`, `k: [B, Hkv, Lk, Dk]`, `v: [B, Hkv, Lk, Dv]`;
/// returns `out: [B, Hq, Lq, Dv]`, `lse: [B, Hq, Lq]` and, with `want_weights`, the softmax
/// weights `[B, Hq, Lq, Lk]` (before dropout).
pub fn attention(
    kernel: Kernel,
    q: &View4<f32>,
    k: &KvView,
    v: &KvView,
    params: &AttnParams<f32>,
    want_weights: bool,
) -> Result<AttnOutput<f32>> {
    attention_tuned(kernel, Tuning::default(), q, k, v, params, want_weights)
}

/// [`attention`] with the flash kernel's plan overridden by `tuning` (ignored by the reference).
pub fn attention_tuned(
    kernel: Kernel,
    tuning: Tuning,
    q: &View4<f32>,
    k: &KvView,
    v: &KvView,
    params: &AttnParams<f32>,
    want_weights: bool,
) -> Result<AttnOutput<f32>> {
    fits_f32(params)?;
    let Some(isa) = flash_isa(kernel, q.dims(), v.dims())? else {
        return widened(k, v, |k, v| reference(q, k, v, params, want_weights));
    };
    let pb = Problem::new(q.dims(), k.dims(), v.dims(), params)?;
    // Half-precision storage is read in place on the x86 kernels (the decode path is bound by
    // the bytes it reads); the portable kernel is compiled for f32 only (`KvElem::ON_PORTABLE`).
    let x86 = isa != Isa::Portable;
    match (k, v) {
        (KvView::F32(k), KvView::F32(v)) => flash::forward(isa, q, k, v, &pb, want_weights, tuning),
        (KvView::F16(k), KvView::F16(v)) if x86 => flash::forward(isa, q, k, v, &pb, want_weights, tuning),
        (KvView::Bf16(k), KvView::Bf16(v)) if x86 => flash::forward(isa, q, k, v, &pb, want_weights, tuning),
        _ => widened(k, v, |k, v| flash::forward(isa, q, k, v, &pb, want_weights, tuning)),
    }
}

/// The flash instruction set that computes a call of `kernel` with queries `q: [B, Hq, Lq, Dk]`
/// and values `v: [B, Hkv, Lk, Dv]`, `None` for the reference. An empty or degenerate call (any of
/// `B`, `Hq`, `Lq`, `Dk`, `Dv` zero) runs the reference whatever the kernel: it has no products to
/// make fast, and its rows hold no elements for the flash kernel's panels and tiles to index (`Dk = 0`
/// gives every key the score 0, as PyTorch's; `Dv = 0` an empty output beside the log-sum-exps).
/// `Lk = 0` stays on the flash kernel, whose rows are then all fully masked.
fn flash_isa(kernel: Kernel, q: [usize; 4], v: [usize; 4]) -> Result<Option<Isa>> {
    let isa = kernel.flash_isa()?;
    Ok(isa.filter(|_| !q.contains(&0) && v[3] > 0))
}

/// Refuses a scale or soft-cap that is finite as given (`f64`) but not in `f32`, where every
/// score would become infinite or NaN.
fn fits_f32(params: &AttnParams<f32>) -> Result<()> {
    for (field, x) in [("scale", params.scale), ("softcap", params.softcap)] {
        if let Some(x) = x.filter(|x| x.is_finite() && !(*x as f32).is_finite()) {
            return Err(AttnError::Param {
                field,
                reason: format!("{x} does not fit in f32 (largest {:e})", f32::MAX),
            });
        }
    }
    Ok(())
}

/// Runs `f` on `k` and `v` as `f32` views: in place when both are stored as `f32`, else on
/// contiguous `f32` copies.
fn widened<R>(k: &KvView, v: &KvView, f: impl FnOnce(&View4<f32>, &View4<f32>) -> Result<R>) -> Result<R> {
    if let (KvView::F32(k), KvView::F32(v)) = (k, v) {
        return f(k, v);
    }
    let (kd, vd) = (k.to_f32("keys as f32")?, v.to_f32("values as f32")?);
    f(&View4::contiguous("k", &kd, k.dims())?, &View4::contiguous("v", &vd, v.dims())?)
}

/// Gradients of [`attention`] in `f32`: `q`, `k`, `v` and `params` as given to the forward, `saved`
/// its output, log-sum-exp and the output's gradient; returns `dq: [B, Hq, Lq, Dk]`,
/// `dk: [B, Hkv, Lk, Dk]`, `dv: [B, Hkv, Lk, Dv]` and, with `want_dbias` and a bias, the bias's
/// gradient in its own shape. Dropout replays the forward's decisions from its seed.
pub fn attention_backward(
    kernel: Kernel,
    q: &View4<f32>,
    k: &KvView,
    v: &KvView,
    saved: &Saved<f32>,
    params: &AttnParams<f32>,
    want_dbias: bool,
) -> Result<AttnGrads<f32>> {
    attention_backward_tuned(kernel, BackwardTuning::default(), q, k, v, saved, params, want_dbias)
}

/// [`attention_backward`] with the flash backward's plan overridden by `tuning` (ignored by the
/// reference).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_tuned(
    kernel: Kernel,
    tuning: BackwardTuning,
    q: &View4<f32>,
    k: &KvView,
    v: &KvView,
    saved: &Saved<f32>,
    params: &AttnParams<f32>,
    want_dbias: bool,
) -> Result<AttnGrads<f32>> {
    fits_f32(params)?;
    let Some(isa) = flash_isa(kernel, q.dims(), v.dims())? else {
        return widened(k, v, |k, v| reference_backward(q, k, v, saved, params, want_dbias));
    };
    let pb = Problem::new(q.dims(), k.dims(), v.dims(), params)?;
    saved.check(&pb.dims)?;
    // The backward reads half-precision keys and values widened to f32 (a copy of `O(Lk·D)` beside
    // its `O(Lq·Lk·D)` products; the scores it recomputes are the forward's bit for bit, widening
    // being exact), so it is compiled once per instruction set rather than once per storage type.
    widened(k, v, |k, v| Ok(flash::backward(isa, q, k, v, saved, &pb, want_dbias, tuning)?))
}
