//! Running a [`Case`]: through a kernel (with the flash plans forced in turn), through
//! `reference::<f64>` and `reference::<f32>` (the [`Oracle`]), and the assertions that compare
//! results — the oracle rule ([`assert_oracle`]) and bit identity ([`assert_bit_identical`]).

use attn_kernels::{attention, attention_tuned, reference, AttnOutput, Kernel, KvView, Path, Tuning, View4};
use attn_testkit::oracle::{self, OUTPUT_FACTOR};

use super::case::Case;

/// The flash kernel's plans that [`Case::check`] forces besides the automatic one: each path, and
/// each with the keys split into shards merged through their log-sum-exps.
const FORCED_PLANS: [Tuning; 4] = [
    Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Decode), shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Prefill), shards: Some(3), ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Decode), shards: Some(3), ..Tuning::DEFAULT },
];

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
    if let Err(e) = oracle_verdict(fast, oracle) {
        panic!("{label}: {e}");
    }
}

/// [`assert_oracle`]'s verdict: the first result that breaks the rule, described.
pub fn oracle_verdict(fast: &AttnOutput<f32>, oracle: &Oracle) -> Result<(), String> {
    let run = |what: &str, f: &[f32], r: &[f64], n: &[f32]| oracle::check(what, f, r, n, OUTPUT_FACTOR);
    run("out", &fast.out, &oracle.r64.out, &oracle.r32.out)?;
    run("lse", &fast.lse, &oracle.r64.lse, &oracle.r32.lse)?;
    match &fast.weights {
        Some(w) => run("weights", w, oracle.r64.weights.as_ref().unwrap(), oracle.r32.weights.as_ref().unwrap()),
        None => Ok(()),
    }
}

impl Case {
    /// `kernel` on the given views with this case's options.
    pub fn run_views(
        &self,
        kernel: Kernel,
        q: &View4<f32>,
        k: &KvView,
        v: &KvView,
        want_weights: bool,
    ) -> attn_kernels::Result<AttnOutput<f32>> {
        attention(kernel, q, k, v, &self.params32(), want_weights)
    }

    /// `kernel` without weights on contiguous `f32` views of this case with the flash plan forced.
    pub fn run_tuned(&self, kernel: Kernel, tuning: Tuning) -> attn_kernels::Result<AttnOutput<f32>> {
        let q = View4::contiguous("q", &self.q, self.q_dims())?;
        let k = View4::contiguous("k", &self.k, self.k_dims())?;
        let v = View4::contiguous("v", &self.v, self.v_dims())?;
        let params = self.params32();
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
        let (bias, sinks) = (self.bias.as_ref().map(|m| wide(&m.data)), self.sinks.as_deref().map(wide));
        let q = View4::contiguous("q", &q, self.q_dims())?;
        let k = View4::contiguous("k", &k, self.k_dims())?;
        let v = View4::contiguous("v", &v, self.v_dims())?;
        reference(&q, &k, &v, &self.params(bias.as_deref(), sinks.as_deref()), want_weights)
    }

    /// `reference::<f32>` on the inputs.
    pub fn reference32(&self, want_weights: bool) -> attn_kernels::Result<AttnOutput<f32>> {
        let q = View4::contiguous("q", &self.q, self.q_dims())?;
        let k = View4::contiguous("k", &self.k, self.k_dims())?;
        let v = View4::contiguous("v", &self.v, self.v_dims())?;
        reference(&q, &k, &v, &self.params32(), want_weights)
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
