//! Recurrent decoding of causal linear attention on candle tensors: [`LinearDecoder`] holds the
//! kernels' [`LinearState`] (`S = Σ φ(k) vᵀ`, `z = Σ φ(k)` per batch entry and key/value head) in
//! `f32` or `f64` and folds in one token per [`LinearDecoder::step`], in `O(F·Dv)` per head. Its
//! outputs equal the causal forward's rows ([`crate::linear_attention`] with `causal`), up to
//! rounding and FAVOR+'s stabiliser, which only `ε` sees. Not differentiable (decoding only).

use attn_kernels::View4;
use candle_core::{DType, Tensor, WithDType};

use super::{check_qkv, LinearOptions, LinearState};
use crate::error::Result;

/// The state in the computing dtype.
#[derive(Debug, Clone)]
enum State {
    F32(LinearState<f32>),
    F64(LinearState<f64>),
}

/// The decoding state of causal linear attention for `B` sequences and `Hkv` key/value heads.
///
/// ```
/// use attn::linear::{FeatureMap, LinearDecoder};
/// use attn::{linear_attention, LinearOptions};
/// # fn main() -> attn::Result<()> {
/// let opts = LinearOptions::new(FeatureMap::Elu).causal(true);
/// let x = |seed| attn::random::uniform(&[1, 2, 5, 8], -1.0, 1.0, seed); // [B, H, L, D]
/// let (q, k, v) = (x(1)?, x(2)?, x(3)?);
/// let full = linear_attention(&q, &k, &v, &opts)?;
/// let mut dec = LinearDecoder::new(&opts, candle_core::DType::F32, 1, 2, 8, 8)?;
/// for t in 0..5 {
///     let at = |x: &candle_core::Tensor| x.narrow(2, t, 1);
///     let row = dec.step(&at(&q)?, &at(&k)?, &at(&v)?)?; // [B, Hq, 1, Dv]
///     let diff = (row - at(&full)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
///     assert!(diff < 1e-5);
/// }
/// assert_eq!(dec.len(), 5);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LinearDecoder {
    state: State,
}

impl LinearDecoder {
    /// An empty state for `b` sequences of `hkv` key/value heads, keys of width `d`, values of
    /// width `dv`, with `opts`' feature map and `ε` (its other fields do not apply), computing in
    /// `f64` when `dtype` is `f64` and in `f32` otherwise.
    pub fn new(opts: &LinearOptions, dtype: DType, b: usize, hkv: usize, d: usize, dv: usize) -> Result<Self> {
        let (map, eps) = (opts.map.clone(), opts.eps);
        let state = if dtype == DType::F64 {
            State::F64(LinearState::new(map, eps, b, hkv, d, dv)?)
        } else {
            State::F32(LinearState::new(map, eps, b, hkv, d, dv)?)
        };
        Ok(Self { state })
    }

    /// Tokens folded in so far.
    pub fn len(&self) -> usize {
        match &self.state {
            State::F32(s) => s.len(),
            State::F64(s) => s.len(),
        }
    }

    /// Whether no token was folded in yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The computing dtype.
    pub fn dtype(&self) -> DType {
        match &self.state {
            State::F32(_) => DType::F32,
            State::F64(_) => DType::F64,
        }
    }

    /// Folds in one token's `k: [B, Hkv, 1, D]`, `v: [B, Hkv, 1, Dv]` and returns the attention of
    /// `q: [B, Hq, 1, D]` over every token so far, `[B, Hq, 1, Dv]` in the computing dtype.
    pub fn step(&mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        check_qkv([q, k, v], "rank 4 [B, H, 1, D]")?;
        match &mut self.state {
            State::F32(s) => step(s, q, k, v),
            State::F64(s) => step(s, q, k, v),
        }
    }
}

/// [`LinearDecoder::step`] in `T`.
fn step<T: attn_kernels::Real + WithDType>(
    s: &mut LinearState<T>,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let host = |t: &Tensor| -> Result<Vec<T>> { Ok(t.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?) };
    let (qd, kd, vd) = (host(q)?, host(k)?, host(v)?);
    let dims = |t: &Tensor| -> [usize; 4] { t.dims().try_into().expect("rank 4, checked") };
    let out = s.step(
        View4::contiguous("q", &qd, dims(q))?,
        View4::contiguous("k", &kd, dims(k))?,
        View4::contiguous("v", &vd, dims(v))?,
    )?;
    let [b, hq, _, _] = dims(q);
    Ok(Tensor::from_vec(out, (b, hq, 1, v.dims()[3]), q.device())?)
}
