//! PyTorch's `gelu`, `x·Φ(x)`, as one `CustomOp1` with its derivative `dx = dy·(Φ(x) + x·Φ'(x))`,
//! exact (erf) or with `approximate="tanh"` ([`Approximate`]): f32 on the vectorised kernel
//! ([`attn_kernels::activation`]), f64 element by element through candle's `erfc` or `tanh`. candle's `gelu_erf` calls a scalar f64 `erf` per
//! element, and forms `1 + erf(x/√2)`, which rounds to 0 in f32 below `x ≈ −5.5`.

use candle_core::cpu::erf::erfc_f64;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

pub use attn_kernels::activation::Approximate;

use super::{contiguous, prepared, with_values, PER_TASK};

/// `x: [..]` → the same shape, `x·Φ(x)` (PyTorch's `gelu(x, approximate=…)`); differentiable.
pub fn gelu(x: &Tensor, approximate: Approximate) -> Result<Tensor> {
    prepared(x)?.apply_op1(GeluOp(approximate))
}

struct GeluOp(Approximate);

/// `out[i] = f(x[i], dy[i])` over rayon's threads, `PER_TASK` elements a task; `f32` values on
/// the kernel (`dy` absent: the forward), `f64` values through `erfc`.
trait Gelu: candle_core::WithDType {
    fn apply(x: &[Self], dy: Option<&[Self]>, out: &mut [Self], approximate: Approximate) -> Result<()>;
}

impl Gelu for f32 {
    fn apply(x: &[f32], dy: Option<&[f32]>, out: &mut [f32], approximate: Approximate) -> Result<()> {
        let run = |r: attn_kernels::Result<()>| r.map_err(|e| candle_core::Error::Msg(format!("gelu: {e}")));
        match dy {
            None => run(attn_kernels::activation::gelu(x, out, approximate)),
            Some(dy) => run(attn_kernels::activation::gelu_backward(x, dy, out, approximate)),
        }
    }
}

impl Gelu for f64 {
    fn apply(x: &[f64], dy: Option<&[f64]>, out: &mut [f64], approximate: Approximate) -> Result<()> {
        const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
        const C: f64 = 0.797_884_560_802_865_4;
        for (i, (o, &x)) in out.iter_mut().zip(x).enumerate() {
            // Φ(x) and Φ'(x) of the chosen form.
            let (cdf, pdf) = match approximate {
                Approximate::None => {
                    (0.5 * erfc_f64(-x * std::f64::consts::FRAC_1_SQRT_2), (-0.5 * x * x).exp() * FRAC_1_SQRT_2PI)
                }
                Approximate::Tanh => {
                    let t = (C * (x + 0.044715 * x * x * x)).tanh();
                    (0.5 * (1.0 + t), 0.5 * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x * x))
                }
            };
            *o = match dy {
                None => x * cdf,
                Some(dy) => dy[i] * (cdf + x * pdf),
            };
        }
        Ok(())
    }
}

/// [`Gelu::apply`] split over rayon's threads.
fn parallel<T: Gelu>(x: &[T], dy: Option<&[T]>, approximate: Approximate) -> Result<Vec<T>> {
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(PER_TASK)
        .zip(x.par_chunks(PER_TASK))
        .enumerate()
        .try_for_each(|(i, (o, x))| T::apply(x, dy.map(|d| &d[i * PER_TASK..][..x.len()]), o, approximate))?;
    Ok(out)
}

fn backward<T: Gelu>(x: &Tensor, dy: &Tensor, approximate: Approximate) -> Result<Tensor> {
    let dy = dy.to_dtype(T::DTYPE)?.contiguous()?;
    let dx = with_values::<T, _>(x, |xs| with_values::<T, _>(&dy, |dys| parallel(xs, Some(dys), approximate)))?;
    Tensor::from_vec(dx, x.shape(), x.device())
}

impl CustomOp1 for GeluOp {
    fn name(&self) -> &'static str {
        "gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = per_float!(s, "gelu", |T| contiguous::<T>(s, l).and_then(|x| parallel(x, None, self.0)));
        Ok((y, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let x = x.contiguous()?;
        Ok(Some(match x.dtype() {
            DType::F64 => backward::<f64>(&x, dy, self.0)?,
            _ => backward::<f32>(&x, dy, self.0)?,
        }))
    }
}
