//! Running a test [`Case`] backward: the `f64` reference gradients (the oracle), the `f32`
//! reference gradients (the baseline error of the rule) and a kernel's, each from its own
//! precision's forward, and the gradient oracle check of all four gradients.

use attn_kernels::{
    attention_backward_tuned, attention_tuned, reference, reference_backward, AttnGrads, BackwardTuning, Kernel,
    KvView, Saved, Tuning, View4,
};
use attn_testkit::oracle::{self, GRADIENT_FACTOR};

use crate::common::{math_path, Case, Rng};

/// A random output gradient `dO: [B, Hq, Lq, Dv]` for `case`.
pub fn random_dout(case: &Case, seed: u64) -> Vec<f32> {
    let d = case.dims;
    Rng::new(seed ^ 0xD0).values(d.b * d.hq * d.lq * d.dv, 1.0)
}

fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&x| x as f64).collect()
}

/// `reference::<f64>` forward then backward on the inputs widened exactly.
pub fn grads64(case: &Case, dout: &[f32]) -> AttnGrads<f64> {
    let (q, k, v, o) = (wide(&case.q), wide(&case.k), wide(&case.v), wide(dout));
    let (bias, sinks) = (case.bias.as_ref().map(|m| wide(&m.data)), case.sinks.as_deref().map(wide));
    let params = case.params(bias.as_deref(), sinks.as_deref());
    let q = View4::contiguous("q", &q, case.q_dims()).unwrap();
    let k = View4::contiguous("k", &k, case.k_dims()).unwrap();
    let v = View4::contiguous("v", &v, case.v_dims()).unwrap();
    let dout = View4::contiguous("grad_out", &o, out_dims(case)).unwrap();
    let fwd = reference(&q, &k, &v, &params, false).unwrap();
    reference_backward(&q, &k, &v, &Saved::of(&fwd, out_dims(case), dout).unwrap(), &params, true).unwrap()
}

/// `[B, Hq, Lq, Dv]`.
pub fn out_dims(case: &Case) -> [usize; 4] {
    let d = case.dims;
    [d.b, d.hq, d.lq, d.dv]
}

/// The forward's and backward's plans that [`check_grads`] forces besides the automatic ones: the
/// backward's keys in one shard or split (with `dq` partials), queries transposed per head or per
/// tile; and the backward after a split-KV forward (shards merged with their log-sum-exp
/// residues).
pub const FORCED_PLANS: [(Tuning, BackwardTuning); 4] = [
    (
        Tuning { path: None, shards: None, ..Tuning::DEFAULT },
        BackwardTuning { shards: Some(1), whole_heads: Some(true), ..BackwardTuning::DEFAULT },
    ),
    (
        Tuning { path: None, shards: None, ..Tuning::DEFAULT },
        BackwardTuning { shards: Some(3), whole_heads: Some(false), ..BackwardTuning::DEFAULT },
    ),
    (
        Tuning { path: None, shards: None, ..Tuning::DEFAULT },
        BackwardTuning { shards: Some(2), whole_heads: Some(true), ..BackwardTuning::DEFAULT },
    ),
    (
        Tuning { path: None, shards: Some(3), ..Tuning::DEFAULT },
        BackwardTuning { shards: None, whole_heads: None, ..BackwardTuning::DEFAULT },
    ),
];

/// `kernel`'s forward then backward on `f32` K/V (the reference kernel is naive32).
pub fn grads(case: &Case, kernel: Kernel, dout: &[f32]) -> attn_kernels::Result<AttnGrads<f32>> {
    grads_tuned(case, kernel, (Tuning::default(), BackwardTuning::default()), dout)
}

/// [`grads`] with the forward's and the backward's plans forced.
pub fn grads_tuned(
    case: &Case,
    kernel: Kernel,
    tunings: (Tuning, BackwardTuning),
    dout: &[f32],
) -> attn_kernels::Result<AttnGrads<f32>> {
    let k = View4::contiguous("k", &case.k, case.k_dims())?;
    let v = View4::contiguous("v", &case.v, case.v_dims())?;
    grads_kv(case, kernel, tunings, &KvView::F32(k), &KvView::F32(v), dout)
}

/// `kernel`'s forward then backward, each on its plan, with K/V in any storage type; the backward
/// takes what the forward saved ([`Saved::of`]), its path included.
pub fn grads_kv(
    case: &Case,
    kernel: Kernel,
    (forward, backward): (Tuning, BackwardTuning),
    k: &KvView,
    v: &KvView,
    dout: &[f32],
) -> attn_kernels::Result<AttnGrads<f32>> {
    let params = case.params32();
    let q = View4::contiguous("q", &case.q, case.q_dims())?;
    let fwd = attention_tuned(kernel, forward, &q, k, v, &params, false)?;
    let dout = View4::contiguous("grad_out", dout, out_dims(case))?;
    attention_backward_tuned(kernel, backward, &q, k, v, &Saved::of(&fwd, out_dims(case), dout)?, &params, true)
}

/// Per element of a gradient that is a sum of many terms which may cancel, the sum of their
/// magnitudes: the rule's floor for such a gradient is taken at those ([`terms`]).
#[derive(Debug, Clone, Default)]
pub struct Terms {
    /// For a bias broadcast along the keys, per `dbias` element.
    pub dbias: Option<Vec<f64>>,
    /// With sinks, per head: `Σ_{b,i} |p_sink · Δ|`.
    pub dsinks: Option<Vec<f64>>,
}

/// Checks `fast` against the oracle `g64` with `g32` as the baseline, every gradient (`dsinks`
/// included); panics naming `label` and the worst element otherwise. `terms` gives the magnitudes
/// of the terms a `dbias` or `dsinks` element sums, where its floor is taken at those.
pub fn assert_grads(label: &str, fast: &AttnGrads<f32>, g64: &AttnGrads<f64>, g32: &AttnGrads<f32>, terms: &Terms) {
    if let Err(e) = grads_verdict(fast, g64, g32, terms) {
        panic!("{label}: {e}");
    }
}

/// [`assert_grads`]'s verdict: the first gradient that breaks the rule, described.
pub fn grads_verdict(
    fast: &AttnGrads<f32>,
    g64: &AttnGrads<f64>,
    g32: &AttnGrads<f32>,
    terms: &Terms,
) -> Result<(), String> {
    let run = |what: &str, f: &[f32], r: &[f64], n: &[f32]| oracle::check(what, f, r, n, GRADIENT_FACTOR);
    run("dq", &fast.dq, &g64.dq, &g32.dq)?;
    run("dk", &fast.dk, &g64.dk, &g32.dk)?;
    run("dv", &fast.dv, &g64.dv, &g32.dv)?;
    match (&fast.dtable, &g64.dtable, &g32.dtable) {
        (Some(f), Some(r), Some(n)) => run("dtable", f, r, n)?,
        (None, None, None) => {}
        _ => return Err("dtable present in some results only".into()),
    }
    let sums = [("dbias", &fast.dbias, &g64.dbias, &g32.dbias, &terms.dbias)];
    let sums = sums.into_iter().chain([("dsinks", &fast.dsinks, &g64.dsinks, &g32.dsinks, &terms.dsinks)]);
    for (what, f, r, n, t) in sums {
        match (f, r, n, t) {
            (Some(f), Some(r), Some(n), None) => run(what, f, r, n),
            (Some(f), Some(r), Some(n), Some(t)) => within_terms(what, f, r, n, t),
            (None, None, None, _) => Ok(()),
            _ => Err(format!("{what} present in some results only")),
        }?;
    }
    Ok(())
}

/// The gradient rule for `f` against `r` with naive `n` whose floor is taken at the largest of
/// `terms` rather than at the reference's magnitude.
fn within_terms(what: &str, f: &[f32], r: &[f64], n: &[f32], terms: &[f64]) -> Result<(), String> {
    let err = |x: &[f32]| x.iter().zip(r).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
    let magnitude = terms.iter().fold(0.0f64, |m, &t| m.max(t));
    let bound = GRADIENT_FACTOR * err(n) + oracle::FLOOR_ULPS * f32::EPSILON as f64 * magnitude;
    if err(f) <= bound {
        Ok(())
    } else {
        Err(format!("{what} error {} exceeds {bound} (terms up to {magnitude})", err(f)))
    }
}

/// Runs `kernel` forward and backward on `case` and checks the gradients under the oracle rule;
/// returns them.
pub fn check_grads(kernel: Kernel, case: &Case, what: &str) -> AttnGrads<f32> {
    let label = format!("{} {what} [{}]", kernel.name(), case.describe());
    let dout = random_dout(case, 7);
    let g64 = grads64(case, &dout);
    let g32 = grads(case, Kernel::Reference, &dout).unwrap_or_else(|e| panic!("{label} naive32: {e}"));
    let terms = terms(case, &dout);
    if kernel != Kernel::Reference {
        for tunings in FORCED_PLANS {
            let forced =
                grads_tuned(case, kernel, tunings, &dout).unwrap_or_else(|e| panic!("{label} {tunings:?}: {e}"));
            assert_grads(&format!("{label} {tunings:?}"), &forced, &g64, &g32, &terms);
        }
    }
    let fast = grads(case, kernel, &dout).unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_grads(&label, &fast, &g64, &g32, &terms);
    fast
}

/// The [`Terms`] of `case` with output gradient `dout` (the `f64` math path's):
/// - for a bias broadcast along the keys, per `dbias` element the magnitude of the terms it is the
///   cancellation of. Such a `dbias` sums `dS_ij` over the keys of a row, which cancel exactly
///   without sinks (softmax does not change when a row is shifted), so the reference value is ~0
///   and the rule's floor must be taken at the magnitude of the terms: any kernel that takes
///   `Σ_j A∘dA` as `dO·O` (FlashAttention's way, in every fast kernel) leaves the rounding of `O`
///   and of that dot product in each row's sum;
/// - with sinks, per head the magnitude of the `p_sink·Δ` that `dsinks` sums over every row of the
///   head: these too may cancel (`Δ` takes either sign), and each carries the rounding of its `Δ`.
pub fn terms(case: &Case, dout: &[f32]) -> Terms {
    let keys_broadcast = case.bias.as_ref().is_some_and(|b| *b.shape.last().unwrap() == 1 && case.dims.lk > 1);
    if !keys_broadcast && case.sinks.is_none() {
        return Terms::default();
    }
    let math = math_path::<f64>(case, dout);
    Terms { dbias: math.dbias_terms.filter(|_| keys_broadcast), dsinks: math.dsinks_terms }
}
