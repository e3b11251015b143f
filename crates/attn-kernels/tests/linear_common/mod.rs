//! A linear-attention test case (sizes, options and seeded inputs) run through the fast kernels
//! and the naive oracle in `f32` and `f64`, and the oracle rule applied to the results.

#![allow(dead_code)]

use attn_kernels::linear::{
    linear_attention, linear_attention_backward, linear_attention_backward_into, linear_attention_into,
    linear_reference, linear_reference_backward, FavorFeatures, FeatureMap, GradsMut, LinearParams,
};
use attn_kernels::rng::SplitMix64;
use attn_kernels::{AttnGrads, Real, View4};
use attn_testkit::oracle::{check, GRADIENT_FACTOR, OUTPUT_FACTOR};

/// Every feature map, FAVOR+ with `m` features for head dimension `d`.
pub fn maps(d: usize, m: usize) -> Vec<FeatureMap> {
    vec![
        FeatureMap::Elu,
        FeatureMap::Relu,
        FeatureMap::Identity,
        FeatureMap::Favor(FavorFeatures::new(d, m, 5).unwrap()),
    ]
}

#[derive(Debug, Clone)]
pub struct Case {
    /// `[B, Hq, Hkv, Lq, Lk, D, Dv]`.
    pub dims: [usize; 7],
    pub map: FeatureMap,
    pub causal: bool,
    pub chunk: usize,
    pub key_lens: Option<Vec<usize>>,
    pub eps: f64,
    /// Segments per head of the chunk-parallel path (0: the call's choice).
    pub segments: usize,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub dout: Vec<f64>,
}

impl Case {
    /// Seeded inputs: `q`, `k` in `[0.05, 1)` for the identity map (positive denominators), in
    /// `[-1, 1)` otherwise (halved for FAVOR+); `v`, `dout` in `[-1, 1)`.
    pub fn new(dims: [usize; 7], map: FeatureMap, causal: bool, chunk: usize, seed: u64) -> Self {
        let [b, hq, hkv, lq, lk, d, dv] = dims;
        let mut g = SplitMix64::new(seed);
        let (lo, hi) = match map {
            FeatureMap::Identity => (0.05, 1.0),
            FeatureMap::Favor(_) => (-0.5, 0.5),
            _ => (-1.0, 1.0),
        };
        let mut take = |n: usize, lo: f32, hi: f32| g.uniform(n, lo, hi).into_iter().map(f64::from).collect();
        let q = take(b * hq * lq * d, lo, hi);
        let k = take(b * hkv * lk * d, lo, hi);
        let v = take(b * hkv * lk * dv, -1.0, 1.0);
        let dout = take(b * hq * lq * dv, -1.0, 1.0);
        Self { dims, map, causal, chunk, key_lens: None, eps: attn_kernels::linear::EPS, segments: 0, q, k, v, dout }
    }

    pub fn params(&self) -> LinearParams<'_> {
        LinearParams {
            causal: self.causal,
            chunk: self.chunk,
            key_lens: self.key_lens.as_deref(),
            eps: self.eps,
            segments: self.segments,
            ..LinearParams::new(&self.map)
        }
    }

    pub fn shapes(&self) -> [[usize; 4]; 4] {
        let [b, hq, hkv, lq, lk, d, dv] = self.dims;
        [[b, hq, lq, d], [b, hkv, lk, d], [b, hkv, lk, dv], [b, hq, lq, dv]]
    }

    /// The inputs in `T`.
    pub fn inputs<T: Real>(&self) -> [Vec<T>; 4] {
        let cast = |x: &Vec<f64>| x.iter().map(|&v| T::from_f64(v).unwrap()).collect();
        [cast(&self.q), cast(&self.k), cast(&self.v), cast(&self.dout)]
    }

    /// Forward output of the fast kernel (`fast`) or the oracle.
    pub fn forward<T: Real>(&self, fast: bool) -> Vec<T> {
        let [q, k, v, _] = self.inputs::<T>();
        let [sq, sk, sv, _] = self.shapes();
        let view = |n, x, s| View4::contiguous(n, x, s).unwrap();
        let (q, k, v) = (view("q", &q, sq), view("k", &k, sk), view("v", &v, sv));
        if fast {
            linear_attention(q, k, v, &self.params()).unwrap()
        } else {
            linear_reference(q, k, v, &self.params()).unwrap()
        }
    }

    /// Gradients of the fast kernel (`fast`) or the oracle.
    pub fn backward<T: Real>(&self, fast: bool) -> AttnGrads<T> {
        let [q, k, v, g] = self.inputs::<T>();
        let [sq, sk, sv, so] = self.shapes();
        let view = |n, x, s| View4::contiguous(n, x, s).unwrap();
        let (qv, kv, vv, gv) = (view("q", &q, sq), view("k", &k, sk), view("v", &v, sv), view("dout", &g, so));
        if fast {
            let out = linear_attention(qv, kv, vv, &self.params()).unwrap();
            linear_attention_backward(qv, kv, vv, view("out", &out, so), gv, &self.params()).unwrap()
        } else {
            linear_reference_backward(qv, kv, vv, gv, &self.params()).unwrap()
        }
    }

    /// Forward output of the fast kernel written by `linear_attention_into` into a buffer that
    /// held `fill` before.
    pub fn forward_into<T: Real>(&self, fill: T) -> Vec<T> {
        let [q, k, v, _] = self.inputs::<T>();
        let [sq, sk, sv, so] = self.shapes();
        let view = |n, x, s| View4::contiguous(n, x, s).unwrap();
        let mut out = vec![fill; so.iter().product()];
        linear_attention_into(view("q", &q, sq), view("k", &k, sk), view("v", &v, sv), &self.params(), &mut out)
            .unwrap();
        out
    }

    /// Gradients of the fast kernel written by `linear_attention_backward_into` into buffers that
    /// held `fill` before (the forward's output from `linear_attention`).
    pub fn backward_into<T: Real>(&self, fill: T) -> AttnGrads<T> {
        let [q, k, v, g] = self.inputs::<T>();
        let [sq, sk, sv, so] = self.shapes();
        let view = |n, x, s| View4::contiguous(n, x, s).unwrap();
        let (qv, kv, vv, gv) = (view("q", &q, sq), view("k", &k, sk), view("v", &v, sv), view("dout", &g, so));
        let out = linear_attention(qv, kv, vv, &self.params()).unwrap();
        let filled = |s: [usize; 4]| vec![fill; s.iter().product()];
        let (mut dq, mut dk, mut dv) = (filled(sq), filled(sk), filled(sv));
        let bufs = GradsMut { dq: &mut dq, dk: &mut dk, dv: &mut dv };
        linear_attention_backward_into(qv, kv, vv, view("out", &out, so), gv, &self.params(), bufs).unwrap();
        AttnGrads { dq, dk, dv, dbias: None, dtable: None, dsinks: None }
    }

    /// The oracle rule on the forward (factor 2) and, with `grads`, on `dq`, `dk`, `dv` (factor 3).
    pub fn assert_oracle(&self, grads: bool) {
        let fast = grads.then(|| self.backward::<f32>(true));
        self.assert_oracle_of(&self.forward::<f32>(true), fast.as_ref());
    }

    /// The oracle rule on the fast kernel's forward `out` (factor 2) and, when given, gradients
    /// `grads` (factor 3).
    pub fn assert_oracle_of(&self, out: &[f32], grads: Option<&AttnGrads<f32>>) {
        let r = check("out", out, &self.forward::<f64>(false), &self.forward::<f32>(false), OUTPUT_FACTOR);
        r.unwrap_or_else(|e| panic!("{}: {e}", self.describe()));
        if let Some(fast) = grads {
            let (ref64, naive) = (self.backward::<f64>(false), self.backward::<f32>(false));
            for (name, f, r, n) in [
                ("dq", &fast.dq, &ref64.dq, &naive.dq),
                ("dk", &fast.dk, &ref64.dk, &naive.dk),
                ("dv", &fast.dv, &ref64.dv, &naive.dv),
            ] {
                check(name, f, r, n, GRADIENT_FACTOR).unwrap_or_else(|e| panic!("{}: {e}", self.describe()));
            }
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} dims {:?} causal {} chunk {} key_lens {:?} segments {}",
            self.map.name(),
            self.dims,
            self.causal,
            self.chunk,
            self.key_lens,
            self.segments
        )
    }
}

/// `max |a − b|`.
pub fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
