//! The plain algorithm written the way PyTorch's math path computes attention (its
//! `_scaled_dot_product_attention_math` and the autograd formulas of softmax and matmul), in `f32`
//! or `f64`, its products fused multiply-adds as in the BLAS kernels under PyTorch's matmuls:
//! every score of a row materialised, masked scores −∞, `P = exp(S − max) / Σ exp(S − max)`,
//! `O = P̄·V`; backward `dV = P̄ᵀ·dO`, `dP = z ∘ dO·Vᵀ`, `dS = P ∘ (dP − rowsum(P ∘ dP))`,
//! `dQ = scale·dX·K`, `dK = scale·dXᵀ·Q`. A sink is the extra column of gpt-oss's formula: its
//! logit joins the maximum and the sum, its probability `p_sink` is dropped after the softmax, and
//! `dsink = −Σ p_sink · rowsum(P ∘ dP)`. Masks come from [`Case::allowed`] (the independent
//! statement of the rules), dropout from [`Case::kept`].
//!
//! In `f32` it is the baseline the reference kernel must match; in `f64` it also measures, per
//! `dbias` element, the magnitude of the terms whose cancellation that gradient is (see
//! [`MathPath::dbias_terms`]).

use attn_kernels::{AttnGrads, Real};

use super::case::Case;

/// The math path's results of one case.
pub struct MathPath<T> {
    /// `out: [B, Hq, Lq, Dv]`.
    pub out: Vec<T>,
    /// `lse: [B, Hq, Lq]`, −∞ for a fully masked row.
    pub lse: Vec<T>,
    /// `dq`, `dk`, `dv`, `dbias` in the bias's shape and `dsinks`.
    pub grads: AttnGrads<T>,
    /// Per `dbias` element, `Σ A_ij·(z_j·Σ_c |dO_ic·v_jc| + |Δ_i|)` over the scores it sums, `Δ_i =
    /// Σ_j A_ij·dA_ij`: the size of the products that `dS = A∘(dA − Δ)` subtracts. A bias
    /// broadcast along the keys has an exact gradient of 0 (softmax ignores a shift of its row),
    /// so its rounding error is a few ulps of these terms, not of the result.
    pub dbias_terms: Option<Vec<T>>,
    /// With sinks, per head `Σ_{b,i} |p_sink · Δ_i|`: the size of the terms `dsinks` sums.
    pub dsinks_terms: Option<Vec<T>>,
}

/// The results and gradients of `case` with output gradient `dout: [B, Hq, Lq, Dv]`, computed in
/// `T`.
pub fn math_path<T: Real>(case: &Case, dout: &[f32]) -> MathPath<T> {
    math_path_rounded(case, dout, |x| x)
}

/// [`math_path`] with every tensor PyTorch's math path materialises rounded by `round` (to bfloat16
/// for its bf16 path): `dO` as given; the products `q·k` and `dO·v`, each score after scaling,
/// soft-capping and the bias; `P`; `dS`, `dS` through the soft-cap and scaled; and the results
/// `out`, `dq`, `dk`, `dv`, `dbias`, `dsinks`. The softmax and its backward's row sum run in `T` on
/// the rounded tensors, as PyTorch's bf16 kernels compute them in f32.
pub fn math_path_rounded<T: Real>(case: &Case, dout: &[f32], round: impl Fn(T) -> T) -> MathPath<T> {
    let d = case.dims;
    let t = |x: f32| T::from_f32(x).unwrap();
    // `Dk = 0` scores every key 0 whatever the scale: the kernels take 1 there, as 1/√1.
    let scale = T::from_f64(case.scale.unwrap_or(1.0 / (d.dk.max(1) as f64).sqrt())).unwrap();
    let cap = case.softcap.map(|c| T::from_f64(c).unwrap());
    let bias_len = case.bias.as_ref().map(|m| m.data.len());
    let mut g = AttnGrads::<T>::zeros(&d, bias_len, case.sinks.is_some(), None).unwrap();
    let mut terms = bias_len.map(|n| vec![T::zero(); n]);
    let mut sink_terms = case.sinks.as_ref().map(|_| vec![T::zero(); d.hq]);
    let (mut out, mut lse) = (vec![T::zero(); d.b * d.hq * d.lq * d.dv], vec![T::neg_infinity(); d.lse_len()]);
    let (mut s, mut dcap) = (vec![T::zero(); d.lk], vec![T::one(); d.lk]);
    let (mut p, mut dp, mut mag) = (vec![T::zero(); d.lk], vec![T::zero(); d.lk], vec![T::zero(); d.lk]);
    for (b, h, i) in case.rows() {
        let kvh = h / d.group();
        let qi: Vec<T> = case.q[case.row(b, h, i) * d.dk..][..d.dk].iter().map(|&x| t(x)).collect();
        let doi: Vec<T> = dout[case.row(b, h, i) * d.dv..][..d.dv].iter().map(|&x| round(t(x))).collect();
        let krow = |j: usize| -> Vec<T> {
            case.k[((b * d.hkv + kvh) * d.lk + j) * d.dk..][..d.dk].iter().map(|&x| t(x)).collect()
        };
        let vrow = |j: usize| -> Vec<T> {
            case.v[((b * d.hkv + kvh) * d.lk + j) * d.dv..][..d.dv].iter().map(|&x| t(x)).collect()
        };
        for j in 0..d.lk {
            (s[j], dcap[j]) = (T::neg_infinity(), T::one());
            if case.allowed(b, h, i, j) {
                let x = round(scale * round(dot(&qi, &krow(j))));
                let (x, c) =
                    cap.map_or((x, T::one()), |c| (round((x / c).tanh() * c), T::one() - (x / c).tanh().powi(2)));
                s[j] = case.bias.as_ref().map_or(x, |m| round(x + t(m.at([b, h, i, j]))));
                dcap[j] = c;
            }
        }
        let sink = case.sinks.as_ref().map_or(T::neg_infinity(), |x| t(x[h]));
        let m = s.iter().fold(sink, |m, &x| m.max(x));
        if m == T::neg_infinity() {
            continue;
        }
        s.iter().zip(&mut p).for_each(|(&x, p)| *p = (x - m).exp());
        let l = p.iter().fold(T::zero(), |a, &x| a + x) + (sink - m).exp();
        p.iter_mut().for_each(|p| *p = round(*p / l));
        lse[case.row(b, h, i)] = m + l.ln();
        let seen: Vec<usize> = (0..d.lk).filter(|&j| p[j] != T::zero()).collect();
        for &j in &seen {
            let z = case.dropout.map_or(T::one(), |dr| if case.kept(b, h, i, j) { t(dr.scale()) } else { T::zero() });
            (dp[j], mag[j]) = (T::zero(), T::zero());
            if z != T::zero() {
                let v = vrow(j);
                dp[j] = round(z * round(dot(&doi, &v)));
                axpy(z * p[j], &v, &mut out[case.row(b, h, i) * d.dv..][..d.dv]);
                mag[j] = z * doi.iter().zip(&v).fold(T::zero(), |a, (&x, &y)| a + (x * y).abs());
                axpy(z * p[j], &doi, &mut g.dv[((b * d.hkv + kvh) * d.lk + j) * d.dv..][..d.dv]);
            }
        }
        let rowsum = seen.iter().fold(T::zero(), |a, &j| a + p[j] * dp[j]);
        if let (Some(ds), Some(st)) = (g.dsinks.as_mut(), sink_terms.as_mut()) {
            let term = (sink - m).exp() / l * rowsum;
            ds[h] = ds[h] - term;
            st[h] = st[h] + term.abs();
        }
        for &j in &seen {
            let ds = round(p[j] * (dp[j] - rowsum));
            if let (Some(gb), Some(tb), Some(bias)) = (g.dbias.as_mut(), terms.as_mut(), case.bias.as_ref()) {
                let at = bias.offset([b, h, i, j]);
                gb[at] = gb[at] + ds;
                tb[at] = tb[at] + p[j] * (mag[j] + rowsum.abs());
            }
            let dx = round(round(ds * dcap[j]) * scale);
            axpy(dx, &krow(j), &mut g.dq[case.row(b, h, i) * d.dk..][..d.dk]);
            axpy(dx, &qi, &mut g.dk[((b * d.hkv + kvh) * d.lk + j) * d.dk..][..d.dk]);
        }
    }
    for x in out.iter_mut().chain(g.dq.iter_mut()).chain(g.dk.iter_mut()).chain(g.dv.iter_mut()) {
        *x = round(*x);
    }
    for x in g.dbias.iter_mut().chain(g.dsinks.iter_mut()).flatten() {
        *x = round(*x);
    }
    MathPath { out, lse, grads: g, dbias_terms: terms, dsinks_terms: sink_terms }
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |acc, (&x, &y)| x.mul_add(y, acc))
}

fn axpy<T: Real>(alpha: T, x: &[T], y: &mut [T]) {
    y.iter_mut().zip(x).for_each(|(y, &x)| *y = alpha.mul_add(x, *y));
}
