//! Shared helpers of the attention test suites: a seeded generator, an owned test [`Case`] (inputs
//! plus every option) that runs itself through a kernel and through `reference::<f64>` /
//! `reference::<f32>`, the oracle assertion, an independent statement of the mask rules (written
//! from the documented semantics, not from `mask.rs`), and the `kernel_tests!` macro that turns one
//! check into one `#[test]` per kernel.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use attn_kernels::rng::SplitMix64;
use attn_kernels::{
    attention, attention_tuned, reference, Align, AttnOutput, AttnParams, Broadcast, Dims, Dropout, Isa, Kernel,
    KvView, MaskSpec, Path, Tuning, View4, Window,
};
use attn_testkit::oracle::{self, OUTPUT_FACTOR};

/// The flash kernel's plans that [`Case::check`] forces besides the automatic one: each path, and
/// each with the keys split into shards merged through their log-sum-exps.
pub const FORCED_PLANS: [Tuning; 4] = [
    Tuning { path: Some(Path::Prefill), shards: None },
    Tuning { path: Some(Path::Decode), shards: None },
    Tuning { path: Some(Path::Prefill), shards: Some(3) },
    Tuning { path: Some(Path::Decode), shards: Some(3) },
];

/// One `#[test]` per kernel for each `group => check` pair: a module `group` holding the tests
/// `reference`, `auto`, `flash_avx512`, `flash_avx2` and `flash_portable`, each calling
/// `check(kernel)` (or reporting a skip when the CPU lacks the kernel's instruction set).
macro_rules! kernel_tests {
    ($($group:ident => $check:ident),* $(,)?) => {$(
        mod $group {
            use attn_kernels::{Isa, Kernel};
            #[test]
            fn reference() {
                crate::common::for_kernel(Kernel::Reference, super::$check)
            }
            #[test]
            fn auto() {
                crate::common::for_kernel(Kernel::Auto, super::$check)
            }
            #[test]
            fn flash_avx512() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx512), super::$check)
            }
            #[test]
            fn flash_avx2() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx2), super::$check)
            }
            #[test]
            fn flash_portable() {
                crate::common::for_kernel(Kernel::Flash(Isa::Portable), super::$check)
            }
        }
    )*};
}
pub(crate) use kernel_tests;

/// Runs `check(kernel)`, or prints why it is skipped when this CPU cannot run `kernel`.
pub fn for_kernel(kernel: Kernel, check: fn(Kernel)) {
    if !kernel.is_available() {
        let isa = match kernel {
            Kernel::Flash(Isa::Avx512) => "avx512f",
            Kernel::Flash(Isa::Avx2) => "avx2+fma",
            _ => kernel.name(),
        };
        println!("skipped: CPU lacks {isa}");
        return;
    }
    check(kernel);
}

/// A small seeded generator (the crate's SplitMix64): every test input is reproducible from its
/// seed.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::new(seed ^ 0x5DEE_CE66_D1CE_4E5B))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.unit_f64()
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit() as f32
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `n` values uniform in `[-amp, amp)`.
    pub fn values(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-amp, amp)).collect()
    }
}

/// Sizes `B, Hq, Hkv, Lq, Lk, Dk, Dv`.
pub fn dims(b: usize, hq: usize, hkv: usize, lq: usize, lk: usize, dk: usize, dv: usize) -> Dims {
    Dims { b, hq, hkv, lq, lk, dk, dv }
}

/// An owned mask or bias tensor of rank 1 to 4, broadcast right-aligned to `[B, Hq, Lq, Lk]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense<T> {
    /// Shape as given (rank 1 to 4).
    pub shape: Vec<usize>,
    /// Row-major data, `shape.iter().product()` elements.
    pub data: Vec<T>,
}

impl<T: Copy> Dense<T> {
    /// The element broadcast to target position `[b, h, i, j]` (index 0 on size-1 dimensions).
    pub fn at(&self, idx: [usize; 4]) -> T {
        let rank = self.shape.len();
        let off =
            self.shape.iter().enumerate().fold(0, |off, (a, &n)| off * n + if n == 1 { 0 } else { idx[4 - rank + a] });
        self.data[off]
    }
}

/// Number of distinct broadcast shapes [`broadcast_shape`] can build (ranks 1 to 4, each subset
/// of dimensions set to 1).
pub const SHAPE_CODES: usize = 2 + 4 + 8 + 16;

/// The broadcast shape numbered `code < SHAPE_CODES` for `target = [B, Hq, Lq, Lk]`: the last
/// `rank` target dimensions with those selected by the code's bit pattern replaced by 1.
pub fn broadcast_shape(target: [usize; 4], code: usize) -> Vec<usize> {
    let (rank, ones) = match code {
        0..=1 => (1, code),
        2..=5 => (2, code - 2),
        6..=13 => (3, code - 6),
        _ => (4, code - 14),
    };
    (0..rank).map(|a| if ones >> a & 1 == 1 { 1 } else { target[4 - rank + a] }).collect()
}

/// A random keep-mask of `shape`, each element `true` with probability `p_true`.
pub fn random_keep(shape: &[usize], p_true: f64, rng: &mut Rng) -> Dense<bool> {
    let n = shape.iter().product();
    Dense { shape: shape.to_vec(), data: (0..n).map(|_| rng.chance(p_true)).collect() }
}

/// A random bias of `shape`: multiples of 2⁻¹⁰ in `[-amp, amp]` (so adding a small integer is exact
/// in `f32`), each element −∞ with probability `p_neg_inf`.
pub fn random_bias(shape: &[usize], amp: f32, p_neg_inf: f64, rng: &mut Rng) -> Dense<f32> {
    let n = shape.iter().product();
    let data =
        (0..n)
            .map(|_| {
                if rng.chance(p_neg_inf) {
                    f32::NEG_INFINITY
                } else {
                    (rng.uniform(-amp, amp) * 1024.0).round() / 1024.0
                }
            })
            .collect();
    Dense { shape: shape.to_vec(), data }
}

/// The `f64` and `f32` reference results of one case (weights included).
pub struct Oracle {
    /// `reference::<f64>` on the `f32` inputs widened exactly.
    pub r64: AttnOutput<f64>,
    /// `reference::<f32>`, the baseline error of the oracle rule.
    pub r32: AttnOutput<f32>,
}

/// Checks `fast` (out, lse and, when present, weights) against `oracle` with the oracle rule;
/// panics naming `label` and the worst element otherwise.
pub fn assert_oracle(label: &str, fast: &AttnOutput<f32>, oracle: &Oracle) {
    let run = |what: &str, f: &[f32], r: &[f64], n: &[f32]| {
        if let Err(e) = oracle::check(what, f, r, n, OUTPUT_FACTOR) {
            panic!("{label}: {e}");
        }
    };
    run("out", &fast.out, &oracle.r64.out, &oracle.r32.out);
    run("lse", &fast.lse, &oracle.r64.lse, &oracle.r32.lse);
    if let Some(w) = &fast.weights {
        run("weights", w, oracle.r64.weights.as_ref().unwrap(), oracle.r32.weights.as_ref().unwrap());
    }
}

/// One attention call with owned inputs and every option; the fields are set directly
/// (`Case { causal: true, ..Case::new(d, seed) }`).
#[derive(Debug, Clone)]
pub struct Case {
    /// Sizes.
    pub dims: Dims,
    /// `[B, Hq, Lq, Dk]`.
    pub q: Vec<f32>,
    /// `[B, Hkv, Lk, Dk]`.
    pub k: Vec<f32>,
    /// `[B, Hkv, Lk, Dv]`.
    pub v: Vec<f32>,
    /// Score multiplier (`None`: `1/√Dk`).
    pub scale: Option<f64>,
    /// Soft-capping value.
    pub softcap: Option<f64>,
    /// Causal masking.
    pub causal: bool,
    /// Sliding window.
    pub window: Option<Window>,
    /// Alignment of the causal diagonal / window centre.
    pub align: Align,
    /// Valid keys per batch, `[B]`.
    pub key_lengths: Option<Vec<usize>>,
    /// Boolean keep-mask.
    pub keep: Option<Dense<bool>>,
    /// Additive bias.
    pub bias: Option<Dense<f32>>,
    /// Dropout.
    pub dropout: Option<Dropout>,
}

impl Case {
    /// Random inputs for `d` (q, k uniform in `[-1.5, 1.5)`, v in `[-1, 1)`), no options.
    pub fn new(d: Dims, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let q = rng.values(d.b * d.hq * d.lq * d.dk, 1.5);
        let k = rng.values(d.b * d.hkv * d.lk * d.dk, 1.5);
        let v = rng.values(d.b * d.hkv * d.lk * d.dv, 1.0);
        Self {
            dims: d,
            q,
            k,
            v,
            scale: None,
            softcap: None,
            causal: false,
            window: None,
            align: Align::TopLeft,
            key_lengths: None,
            keep: None,
            bias: None,
            dropout: None,
        }
    }

    /// `[B, Hq, Lq, Dk]`.
    pub fn q_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hq, d.lq, d.dk]
    }

    /// `[B, Hkv, Lk, Dk]`.
    pub fn k_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hkv, d.lk, d.dk]
    }

    /// `[B, Hkv, Lk, Dv]`.
    pub fn v_dims(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hkv, d.lk, d.dv]
    }

    /// `[B, Hq, Lq, Lk]`, the target of masks and bias.
    pub fn target(&self) -> [usize; 4] {
        let d = self.dims;
        [d.b, d.hq, d.lq, d.lk]
    }

    /// Flat index of query row `(b, h, i)` (into lse; times `Dv` into out, times `Lk` into weights).
    pub fn row(&self, b: usize, h: usize, i: usize) -> usize {
        (b * self.dims.hq + h) * self.dims.lq + i
    }

    /// A one-line description for failure messages.
    pub fn describe(&self) -> String {
        let d = self.dims;
        let mut s = format!("B={} Hq={} Hkv={} Lq={} Lk={} Dk={} Dv={}", d.b, d.hq, d.hkv, d.lq, d.lk, d.dk, d.dv);
        if self.causal {
            s += " causal";
        }
        if let Some(w) = self.window {
            s += &format!(" window({:?},{:?})", w.left, w.right);
        }
        if self.causal || self.window.is_some() {
            s += &format!(" {:?}", self.align);
        }
        if let Some(kl) = &self.key_lengths {
            s += &format!(" key_lengths={kl:?}");
        }
        if let Some(m) = &self.keep {
            s += &format!(" keep{:?}", m.shape);
        }
        if let Some(m) = &self.bias {
            s += &format!(" bias{:?}", m.shape);
        }
        if let Some(c) = self.softcap {
            s += &format!(" softcap={c}");
        }
        if let Some(x) = self.scale {
            s += &format!(" scale={x}");
        }
        if let Some(dr) = self.dropout {
            s += &format!(" dropout(p={}, seed={})", dr.p, dr.seed);
        }
        s
    }

    /// The call's parameters in `T`, with the bias data given already converted to `T`.
    pub fn params<'a, T>(&'a self, bias: Option<&'a [T]>) -> AttnParams<'a, T> {
        let keep = self.keep.as_ref().map(|m| Broadcast::new("mask", &m.data, &m.shape).expect("keep-mask layout"));
        let bias =
            self.bias.as_ref().zip(bias).map(|(m, data)| Broadcast::new("bias", data, &m.shape).expect("bias layout"));
        AttnParams {
            scale: self.scale,
            mask: MaskSpec {
                causal: self.causal,
                window: self.window,
                align: self.align,
                key_lengths: self.key_lengths.as_deref(),
                keep,
                bias,
            },
            softcap: self.softcap,
            dropout: self.dropout,
        }
    }

    /// `kernel` on the given views with this case's options.
    pub fn run_views(
        &self,
        kernel: Kernel,
        q: &View4<f32>,
        k: &KvView,
        v: &KvView,
        want_weights: bool,
    ) -> attn_kernels::Result<AttnOutput<f32>> {
        attention(kernel, q, k, v, &self.params(self.bias.as_ref().map(|m| &m.data[..])), want_weights)
    }

    /// `kernel` without weights on contiguous `f32` views of this case with the flash plan forced.
    pub fn run_tuned(&self, kernel: Kernel, tuning: Tuning) -> attn_kernels::Result<AttnOutput<f32>> {
        let q = View4::contiguous("q", &self.q, self.q_dims())?;
        let k = View4::contiguous("k", &self.k, self.k_dims())?;
        let v = View4::contiguous("v", &self.v, self.v_dims())?;
        let params = self.params(self.bias.as_ref().map(|m| &m.data[..]));
        attention_tuned(kernel, tuning, &q, &KvView::F32(k), &KvView::F32(v), &params, false)
    }

    /// `kernel` on contiguous `f32` views of this case.
    pub fn run(&self, kernel: Kernel, want_weights: bool) -> attn_kernels::Result<AttnOutput<f32>> {
        let q = View4::contiguous("q", &self.q, self.q_dims())?;
        let k = View4::contiguous("k", &self.k, self.k_dims())?;
        let v = View4::contiguous("v", &self.v, self.v_dims())?;
        self.run_views(kernel, &q, &KvView::F32(k), &KvView::F32(v), want_weights)
    }

    /// `reference::<f64>` on the inputs widened exactly to `f64`.
    pub fn reference64(&self, want_weights: bool) -> attn_kernels::Result<AttnOutput<f64>> {
        let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let (q, k, v) = (wide(&self.q), wide(&self.k), wide(&self.v));
        let bias = self.bias.as_ref().map(|m| wide(&m.data));
        let q = View4::contiguous("q", &q, self.q_dims())?;
        let k = View4::contiguous("k", &k, self.k_dims())?;
        let v = View4::contiguous("v", &v, self.v_dims())?;
        reference(&q, &k, &v, &self.params(bias.as_deref()), want_weights)
    }

    /// `reference::<f32>` on the inputs.
    pub fn reference32(&self, want_weights: bool) -> attn_kernels::Result<AttnOutput<f32>> {
        let q = View4::contiguous("q", &self.q, self.q_dims())?;
        let k = View4::contiguous("k", &self.k, self.k_dims())?;
        let v = View4::contiguous("v", &self.v, self.v_dims())?;
        reference(&q, &k, &v, &self.params(self.bias.as_ref().map(|m| &m.data[..])), want_weights)
    }

    /// Both references, weights included.
    pub fn oracle(&self) -> Oracle {
        let r64 = self.reference64(true).unwrap_or_else(|e| panic!("reference64 on {}: {e}", self.describe()));
        let r32 = self.reference32(true).unwrap_or_else(|e| panic!("reference32 on {}: {e}", self.describe()));
        Oracle { r64, r32 }
    }

    /// Runs `kernel` without and with weights and checks both against the oracle; returns the run
    /// with weights.
    pub fn check(&self, kernel: Kernel, what: &str) -> AttnOutput<f32> {
        let label = format!("{} {what} [{}]", kernel.name(), self.describe());
        let oracle = self.oracle();
        let plain = self.run(kernel, false).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(plain.weights.is_none(), "{label}: weights returned though not asked for");
        assert_oracle(&format!("{label} (without weights)"), &plain, &oracle);
        if kernel != Kernel::Reference {
            for tuning in FORCED_PLANS {
                let res = self.run_tuned(kernel, tuning).unwrap_or_else(|e| panic!("{label} {tuning:?}: {e}"));
                assert_oracle(&format!("{label} {tuning:?}"), &res, &oracle);
            }
        }
        let full = self.run(kernel, true).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_oracle(&label, &full, &oracle);
        full
    }

    /// Whether query `(b, h, i)` may attend key `j`, stated from the documented rules: causal
    /// `j <= c`, window `c - left <= j <= c + right` with `c = i` (top-left) or `i + Lk - Lq`
    /// (bottom-right), `j < key_lengths[b]`, keep-mask true, bias not −∞.
    pub fn allowed(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let d = self.dims;
        let c = i as i64 + if self.align == Align::BottomRight { d.lk as i64 - d.lq as i64 } else { 0 };
        let j64 = j as i64;
        let window = self.window.unwrap_or_default();
        let outside = (self.causal && j64 > c)
            || window.left.is_some_and(|l| j64 < c - l as i64)
            || window.right.is_some_and(|r| j64 > c + r as i64)
            || self.key_lengths.as_ref().is_some_and(|kl| j >= kl[b])
            || self.keep.as_ref().is_some_and(|m| !m.at([b, h, i, j]))
            || self.bias.as_ref().is_some_and(|m| m.at([b, h, i, j]) == f32::NEG_INFINITY);
        !outside
    }

    /// Whether query `(b, h, i)` may attend any key.
    pub fn any_allowed(&self, b: usize, h: usize, i: usize) -> bool {
        (0..self.dims.lk).any(|j| self.allowed(b, h, i, j))
    }

    /// Checks the structure the mask rules impose on a run with weights of finite inputs: a row
    /// with no allowed key has out exactly 0, lse −∞ and weights 0; any other row has finite out
    /// and lse, non-negative weights summing to 1 and exactly 0 at masked keys. Returns the number
    /// of fully masked rows.
    pub fn assert_structure(&self, label: &str, res: &AttnOutput<f32>) -> usize {
        let d = self.dims;
        let w = res.weights.as_ref().expect("a run with weights");
        let mut masked_rows = 0;
        for (b, h, i) in self.rows() {
            let r = self.row(b, h, i);
            let out = &res.out[r * d.dv..(r + 1) * d.dv];
            let wr = &w[r * d.lk..(r + 1) * d.lk];
            if !self.any_allowed(b, h, i) {
                masked_rows += 1;
                assert!(out.iter().all(|&x| x == 0.0), "{label}: fully masked row ({b},{h},{i}) out {out:?}");
                assert_eq!(res.lse[r], f32::NEG_INFINITY, "{label}: fully masked row ({b},{h},{i}) lse");
                assert!(wr.iter().all(|&x| x == 0.0), "{label}: fully masked row ({b},{h},{i}) weights {wr:?}");
                continue;
            }
            assert!(out.iter().all(|x| x.is_finite()), "{label}: row ({b},{h},{i}) out {out:?}");
            assert!(res.lse[r].is_finite(), "{label}: row ({b},{h},{i}) lse {}", res.lse[r]);
            for (j, &x) in wr.iter().enumerate() {
                assert!(x >= 0.0, "{label}: weight ({b},{h},{i},{j}) = {x}");
                assert!(self.allowed(b, h, i, j) || x == 0.0, "{label}: masked weight ({b},{h},{i},{j}) = {x}");
            }
            let sum: f64 = wr.iter().map(|&x| x as f64).sum();
            let tol = 1e-5 + 2.0 * d.lk as f64 * f32::EPSILON as f64;
            assert!((sum - 1.0).abs() <= tol, "{label}: row ({b},{h},{i}) weights sum to {sum}");
        }
        masked_rows
    }

    /// Every query row `(b, h, i)`.
    pub fn rows(&self) -> impl Iterator<Item = (usize, usize, usize)> {
        let d = self.dims;
        (0..d.b).flat_map(move |b| (0..d.hq).flat_map(move |h| (0..d.lq).map(move |i| (b, h, i))))
    }

    /// Whether dropout keeps weight `(b, h, i, j)`, from the library's counter-based draw.
    pub fn kept(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let d = self.dims;
        let dr = self.dropout.expect("a case with dropout");
        dr.keeps(dr.row_key(b, h, i, [d.hq, d.lq]), j)
    }

    /// The K row `[Dk]` and V row `[Dv]` of key `j` in KV head `g` of batch `b`.
    pub fn kv_rows_mut(&mut self, b: usize, g: usize, j: usize) -> (&mut [f32], &mut [f32]) {
        let d = self.dims;
        let r = (b * d.hkv + g) * d.lk + j;
        (&mut self.k[r * d.dk..(r + 1) * d.dk], &mut self.v[r * d.dv..(r + 1) * d.dv])
    }

    /// Fills key `(b, g, j)`'s K and V rows with NaN, +∞ and −∞ in turn.
    pub fn poison_key(&mut self, b: usize, g: usize, j: usize) {
        const BAD: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let (k, v) = self.kv_rows_mut(b, g, j);
        k.iter_mut().enumerate().for_each(|(e, x)| *x = BAD[e % 3]);
        v.iter_mut().enumerate().for_each(|(e, x)| *x = BAD[(e + 1) % 3]);
    }

    /// The keys `(b, g, j)` that no query of any head reading KV head `g` may attend.
    pub fn keys_masked_everywhere(&self) -> Vec<(usize, usize, usize)> {
        let d = self.dims;
        let group = d.hq / d.hkv;
        let mut keys = Vec::new();
        for b in 0..d.b {
            for g in 0..d.hkv {
                for j in 0..d.lk {
                    let read = (g * group..(g + 1) * group).any(|h| (0..d.lq).any(|i| self.allowed(b, h, i, j)));
                    if !read {
                        keys.push((b, g, j));
                    }
                }
            }
        }
        keys
    }

    /// The same call with K/V heads repeated to `Hq` (`Hkv = Hq`).
    pub fn repeat_kv(&self) -> Case {
        let d = self.dims;
        let group = d.hq / d.hkv;
        let repeat = |x: &[f32], dd: usize| {
            let mut out = Vec::with_capacity(d.b * d.hq * d.lk * dd);
            for b in 0..d.b {
                for h in 0..d.hq {
                    let at = ((b * d.hkv + h / group) * d.lk) * dd;
                    out.extend_from_slice(&x[at..at + d.lk * dd]);
                }
            }
            out
        };
        Case { dims: Dims { hkv: d.hq, ..d }, k: repeat(&self.k, d.dk), v: repeat(&self.v, d.dv), ..self.clone() }
    }
}

/// Asserts two results are bit-for-bit identical (NaN payloads aside).
pub fn assert_bit_identical(label: &str, a: &AttnOutput<f32>, b: &AttnOutput<f32>) {
    let same = |x: &[f32], y: &[f32]| {
        x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
    };
    assert!(same(&a.out, &b.out), "{label}: out differs");
    assert!(same(&a.lse, &b.lse), "{label}: lse differs");
    match (&a.weights, &b.weights) {
        (Some(x), Some(y)) => assert!(same(x, y), "{label}: weights differ"),
        (None, None) => {}
        _ => panic!("{label}: only one run returned weights"),
    }
}
