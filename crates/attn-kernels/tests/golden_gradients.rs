//! Golden gradient tests: the backward of every kernel against PyTorch float64 autograd, stored in
//! `tests/fixtures/*.safetensors` by `scripts/gen_fixtures.py` next to the forward results (an
//! output gradient `grad_out` and the gradients `dq`, `dk`, `dv`, `dbias`, `dsinks` of
//! `(out * grad_out).sum()`; the same shapes and masks as `golden.rs`, fully masked rows included).
//!
//! - The `f64` reference backward (after the `f64` reference forward) must match PyTorch to
//!   `1e-9 · (1 + magnitude)`.
//! - Each kernel of [`Kernel::ALL`] runs forward in `f32` on the inputs cast to `f32`, then
//!   [`attention_backward`] on its own output and log-sum-exp, and must pass the gradient oracle
//!   rule ([`oracle::check`] with [`GRADIENT_FACTOR`]) against the fixture's gradients, with the
//!   `f32` reference forward and backward on the same inputs as the baseline; and again with K/V
//!   stored as f16 and as bf16 (the oracle is then the `f64` reference on the rounded values).
//! - A bias broadcast along the keys has an exact gradient of ~0 (a row's `dS` sum to zero), so
//!   its `dbias` is held to the rule with the floor taken at the magnitude of the terms it sums
//!   (as `tests/gradients_parts/harness.rs` does).

use crate::common;
use crate::golden_parts;

use attn_kernels::{
    attention, attention_backward, reference, reference_backward, AttnGrads, AttnParams, Broadcast, Isa, Kernel,
    KvView, Real, Saved, View4,
};
use attn_testkit::oracle::{self, GRADIENT_FACTOR};
use golden_parts::compare::check_f64_within;
use golden_parts::fixture::{fixture_paths, Fixture, Grads, Tensor};
use half::{bf16, f16};

/// Relative tolerance of the `f64` reference backward against PyTorch.
const GRAD_F64_TOLERANCE: f64 = 1e-9;

fn load_all() -> Vec<Fixture> {
    fixture_paths().iter().map(|p| Fixture::load(p).unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// One check of one fixture.
type FixtureCheck<'a> = &'a dyn Fn(&Fixture) -> Result<(), String>;

/// Runs every check on every fixture and fails with every failure listed.
fn check_all(checks: &[FixtureCheck]) {
    let fixtures = load_all();
    let failures: Vec<String> = checks
        .iter()
        .flat_map(|check| fixtures.iter().filter_map(|fx| check(fx).err()))
        .flat_map(|f| f.lines().map(str::to_string).collect::<Vec<_>>())
        .collect();
    let runs = checks.len() * fixtures.len();
    assert!(failures.is_empty(), "{} of {runs} fixture checks failed:\n{}", failures.len(), failures.join("\n"));
}

fn grads_of(fx: &Fixture) -> Result<&Grads, String> {
    fx.grads
        .as_ref()
        .ok_or_else(|| format!("{}: no gradient tensors (regenerate with scripts/gen_fixtures.py)", fx.file))
}

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&x| x as f32).collect()
}

fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&x| x as f64).collect()
}

fn out_dims(fx: &Fixture) -> [usize; 4] {
    fx.out.dims4()
}

/// The reference forward then backward in `T`, on `q`, `k`, `v`, `dout` (this fixture's tensors
/// in `T`) and `params`, with the bias's gradient.
fn reference_grads<T: Real>(
    fx: &Fixture,
    [q, k, v, dout]: [&[T]; 4],
    params: &AttnParams<T>,
) -> Result<AttnGrads<T>, String> {
    let fail = |e: attn_kernels::AttnError| format!("{}: reference: {e}", fx.file);
    let [q, k, v] = fx.views([q, k, v])?;
    let fwd = reference(&q, &k, &v, params, false).map_err(fail)?;
    let dout = View4::contiguous("grad_out", dout, out_dims(fx)).map_err(fail)?;
    let saved = Saved::of(&fwd, out_dims(fx), dout).map_err(fail)?;
    reference_backward(&q, &k, &v, &saved, params, true).map_err(fail)
}

/// `kernel`'s forward in `f32` then its backward on that forward's output and log-sum-exp.
fn kernel_grads(
    kernel: Kernel,
    fx: &Fixture,
    q: &[f32],
    [k, v]: [&KvView; 2],
    dout: &[f32],
    params: &AttnParams<f32>,
) -> Result<AttnGrads<f32>, String> {
    let fail = |e: attn_kernels::AttnError| format!("{}: {}: {e}", fx.file, kernel.name());
    let q = View4::contiguous("q", q, fx.q.dims4()).map_err(fail)?;
    let fwd = attention(kernel, &q, k, v, params, false).map_err(fail)?;
    let dout = View4::contiguous("grad_out", dout, out_dims(fx)).map_err(fail)?;
    let saved = Saved::of(&fwd, out_dims(fx), dout).map_err(fail)?;
    attention_backward(kernel, &q, k, v, &saved, params, true).map_err(fail)
}

/// The oracle's gradients, whoever computed them: the fixture's (PyTorch) or the `f64` reference's.
struct Oracle<'a> {
    dq: &'a [f64],
    dk: &'a [f64],
    dv: &'a [f64],
    dbias: Option<&'a [f64]>,
    dsinks: Option<&'a [f64]>,
}

impl<'a> Oracle<'a> {
    fn of_fixture(g: &'a Grads) -> Self {
        let data = |t: &'a Option<Tensor<f64>>| t.as_ref().map(|t| t.data.as_slice());
        Self { dq: &g.dq.data, dk: &g.dk.data, dv: &g.dv.data, dbias: data(&g.dbias), dsinks: data(&g.dsinks) }
    }

    fn of_reference(g: &'a AttnGrads<f64>) -> Self {
        Self { dq: &g.dq, dk: &g.dk, dv: &g.dv, dbias: g.dbias.as_deref(), dsinks: g.dsinks.as_deref() }
    }
}

/// Checks every gradient of `fast` against `oracle` with `naive` as the baseline under the
/// gradient rule, reporting every failing gradient. `terms`, given for a bias broadcast along the
/// keys, takes the rule's floor for `dbias` at the magnitude of the terms each element sums (see
/// [`dbias_terms`]).
fn check_grads(
    tag: &str,
    fast: &AttnGrads<f32>,
    oracle: &Oracle,
    naive: &AttnGrads<f32>,
    terms: Option<&[f64]>,
) -> Result<(), String> {
    let rule = |what: &str, f: &[f32], r: &[f64], n: &[f32]| {
        oracle::check(&format!("{tag}: {what}"), f, r, n, GRADIENT_FACTOR)
    };
    let dbias = match (&fast.dbias, oracle.dbias, &naive.dbias, terms) {
        (Some(f), Some(r), Some(n), None) => rule("dbias", f, r, n),
        (Some(f), Some(r), Some(n), Some(terms)) => check_dbias_terms(tag, f, r, n, terms),
        (None, None, None, _) => Ok(()),
        _ => Err(format!("{tag}: dbias present in some results only")),
    };
    let dsinks = match (&fast.dsinks, oracle.dsinks, &naive.dsinks) {
        (Some(f), Some(r), Some(n)) => rule("dsinks", f, r, n),
        (None, None, None) => Ok(()),
        _ => Err(format!("{tag}: dsinks present in some results only")),
    };
    let results = [
        rule("dq", &fast.dq, oracle.dq, &naive.dq),
        rule("dk", &fast.dk, oracle.dk, &naive.dk),
        rule("dv", &fast.dv, oracle.dv, &naive.dv),
        dbias,
        dsinks,
    ];
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// The gradient rule for a `dbias` whose exact value is ~0, the floor taken at the magnitude of
/// `terms` instead of the reference's.
fn check_dbias_terms(tag: &str, fast: &[f32], r: &[f64], naive: &[f32], terms: &[f64]) -> Result<(), String> {
    if fast.len() != r.len() || naive.len() != r.len() {
        return Err(format!("{tag}: dbias: {} and {} elements, expected {}", fast.len(), naive.len(), r.len()));
    }
    // A NaN error counts as infinite.
    let err = |x: &[f32]| {
        let e = |(&a, &b): (&f32, &f64)| (a as f64 - b).abs();
        x.iter().zip(r).map(e).map(|e| if e.is_nan() { f64::INFINITY } else { e }).fold(0.0f64, f64::max)
    };
    let (fast_err, naive_err) = (err(fast), err(naive));
    let magnitude = terms.iter().fold(0.0f64, |m, &t| m.max(t));
    let floor = oracle::FLOOR_ULPS * f32::EPSILON as f64 * magnitude;
    if fast_err <= GRADIENT_FACTOR * naive_err + floor {
        Ok(())
    } else {
        Err(format!(
            "{tag}: dbias (broadcast along keys): max error {fast_err:e} exceeds \
             {GRADIENT_FACTOR}·{naive_err:e} + {floor:e} (terms up to {magnitude:e})"
        ))
    }
}

/// For a bias broadcast along the keys (its last size 1, `Lk > 1`), per `dbias` element the sum of
/// `|dS|` over the positions it is broadcast to, from the `f64` reference on `q`, `k`, `v`, `bias`
/// and `dout` (the oracle's inputs) with the bias expanded to `[B, Hq, Lq, Lk]`; else `None`.
/// Such a `dbias` sums `dS_ij` over the keys of a row, which cancel exactly, so its reference value
/// is ~0 and a kernel taking `Σ_j A∘dA` as `dO·O` keeps the rounding of `O` in each row's sum.
fn dbias_terms(
    fx: &Fixture,
    [q, k, v, dout]: [&[f64]; 4],
    [bias, sinks]: [Option<&[f64]>; 2],
) -> Result<Option<Vec<f64>>, String> {
    let (Some(shape), Some(bias)) = (fx.bias.as_ref().map(|b| &b.shape), bias) else { return Ok(None) };
    let [b, hq, lq, _] = fx.q.dims4();
    let lk = fx.k.dims4()[2];
    if shape.last() != Some(&1) || lk <= 1 {
        return Ok(None);
    }
    let fail = |e: attn_kernels::AttnError| format!("{}: dbias terms: {e}", fx.file);
    let target = [b, hq, lq, lk];
    let st = Broadcast::new("bias", bias, shape).map_err(fail)?.strides_for("bias", target).map_err(fail)?;
    let at = |x: usize| {
        let idx = [x / (hq * lq * lk), x / (lq * lk) % hq, x / lk % lq, x % lk];
        idx.iter().zip(st).map(|(i, s)| i * s).sum::<usize>()
    };
    let full: Vec<f64> = (0..b * hq * lq * lk).map(|x| bias[at(x)]).collect();
    let mut params = fx.params(Some(bias), sinks)?;
    params.mask.bias = Some(Broadcast::new("bias", &full, &target).map_err(fail)?);
    let ds = reference_grads(fx, [q, k, v, dout], &params)?.dbias.ok_or_else(|| format!("{}: no dS", fx.file))?;
    let mut terms = vec![0.0; bias.len()];
    for (x, g) in ds.iter().enumerate() {
        terms[at(x)] += g.abs();
    }
    Ok(Some(terms))
}

fn check_reference_f64(fx: &Fixture) -> Result<(), String> {
    let g = grads_of(fx)?;
    let params =
        fx.params(fx.bias.as_ref().map(|b| b.data.as_slice()), fx.sinks.as_ref().map(|s| s.data.as_slice()))?;
    let got = reference_grads(fx, [&fx.q.data, &fx.k.data, &fx.v.data, &g.grad_out.data], &params)?;
    let tol = GRAD_F64_TOLERANCE;
    check_f64_within(&format!("{}: dq", fx.file), &got.dq, &g.dq.data, tol)?;
    check_f64_within(&format!("{}: dk", fx.file), &got.dk, &g.dk.data, tol)?;
    check_f64_within(&format!("{}: dv", fx.file), &got.dv, &g.dv.data, tol)?;
    match (&got.dbias, &g.dbias) {
        (Some(got), Some(want)) => check_f64_within(&format!("{}: dbias", fx.file), got, &want.data, tol),
        (None, None) => Ok(()),
        _ => Err(format!("{}: dbias present in one of reference and fixture only", fx.file)),
    }?;
    match (&got.dsinks, &g.dsinks) {
        (Some(got), Some(want)) => check_f64_within(&format!("{}: dsinks", fx.file), got, &want.data, tol),
        (None, None) => Ok(()),
        _ => Err(format!("{}: dsinks present in one of reference and fixture only", fx.file)),
    }
}

/// K/V in `f32`: the oracle is the fixture's PyTorch gradients, the baseline the `f32` reference
/// on the inputs cast to `f32`.
fn check_kernel(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    let g = grads_of(fx)?;
    let (q32, k32, v32, dout32) =
        (to_f32(&fx.q.data), to_f32(&fx.k.data), to_f32(&fx.v.data), to_f32(&g.grad_out.data));
    let (bias32, sinks32) = (fx.bias.as_ref().map(|b| to_f32(&b.data)), fx.sinks.as_ref().map(|s| to_f32(&s.data)));
    let params = fx.params(bias32.as_deref(), sinks32.as_deref())?;
    let naive = reference_grads(fx, [&q32, &k32, &v32, &dout32], &params)?;
    let [_, k, v] = fx.views([&q32, &k32, &v32])?;
    let fast = kernel_grads(kernel, fx, &q32, [&KvView::F32(k), &KvView::F32(v)], &dout32, &params)?;
    let fx64 = [fx.bias.as_ref().map(|b| b.data.as_slice()), fx.sinks.as_ref().map(|s| s.data.as_slice())];
    let terms = dbias_terms(fx, [&fx.q.data, &fx.k.data, &fx.v.data, &g.grad_out.data], fx64)?;
    let tag = format!("{}: {} (f32 K/V)", fx.file, kernel.name());
    check_grads(&tag, &fast, &Oracle::of_fixture(g), &naive, terms.as_deref())
}

/// Keys and values stored in half precision: the fixture's K/V rounded to `H`, the oracle the
/// `f64` reference on those rounded values (and the other inputs cast to `f32`), the baseline the
/// `f32` reference on them, and the kernel reading the `H` storage directly.
fn check_kernel_half<H: Copy>(
    kernel: Kernel,
    fx: &Fixture,
    storage: &str,
    round: fn(f64) -> H,
    widen: fn(H) -> f32,
    view: for<'a> fn(View4<'a, H>) -> KvView<'a>,
) -> Result<(), String> {
    let g = grads_of(fx)?;
    let rounded = |x: &[f64]| x.iter().map(|&x| round(x)).collect::<Vec<H>>();
    let (kh, vh) = (rounded(&fx.k.data), rounded(&fx.v.data));
    let widened = |x: &[H]| x.iter().map(|&x| widen(x)).collect::<Vec<f32>>();
    let (q32, k32, v32, dout32) = (to_f32(&fx.q.data), widened(&kh), widened(&vh), to_f32(&g.grad_out.data));
    let (q64, k64, v64, dout64) = (wide(&q32), wide(&k32), wide(&v32), wide(&dout32));
    let (bias32, sinks32) = (fx.bias.as_ref().map(|b| to_f32(&b.data)), fx.sinks.as_ref().map(|s| to_f32(&s.data)));
    let (bias64, sinks64) = (bias32.as_deref().map(wide), sinks32.as_deref().map(wide));
    let params = fx.params(bias32.as_deref(), sinks32.as_deref())?;
    let oracle = reference_grads(fx, [&q64, &k64, &v64, &dout64], &fx.params(bias64.as_deref(), sinks64.as_deref())?)?;
    let naive = reference_grads(fx, [&q32, &k32, &v32, &dout32], &params)?;
    let fail = |e: attn_kernels::AttnError| format!("{}: {e}", fx.file);
    let kv = View4::contiguous("k", &kh, fx.k.dims4()).map_err(fail)?;
    let vv = View4::contiguous("v", &vh, fx.v.dims4()).map_err(fail)?;
    let fast = kernel_grads(kernel, fx, &q32, [&view(kv), &view(vv)], &dout32, &params)?;
    let terms = dbias_terms(fx, [&q64, &k64, &v64, &dout64], [bias64.as_deref(), sinks64.as_deref()])?;
    let tag = format!("{}: {} ({storage} K/V)", fx.file, kernel.name());
    check_grads(&tag, &fast, &Oracle::of_reference(&oracle), &naive, terms.as_deref())
}

// The closures give the constructors the higher-ranked type `check_kernel_half` needs.
#[allow(clippy::redundant_closure)]
fn check_kernel_f16(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    check_kernel_half(kernel, fx, "f16", f16::from_f64, f16::to_f32, |v| KvView::F16(v))
}

#[allow(clippy::redundant_closure)]
fn check_kernel_bf16(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    check_kernel_half(kernel, fx, "bf16", bf16::from_f64, bf16::to_f32, |v| KvView::Bf16(v))
}

fn run_kernel(kernel: Kernel) {
    common::assert_available(kernel);
    check_all(&[&|fx| check_kernel(kernel, fx), &|fx| check_kernel_f16(kernel, fx), &|fx| {
        check_kernel_bf16(kernel, fx)
    }]);
}

/// One `#[test]` per kernel (`[avx512]`/`[avx2]`: ignored where this machine lacks it, see
/// `common::isa_test!`), and the list of kernels so covered.
macro_rules! golden_gradient_tests {
    ($($test:ident $([$isa:ident])? => $kernel:expr),* $(,)?) => {
        const TESTED: &[Kernel] = &[$($kernel),*];
        $(
            common::isa_test!([$($isa)?] #[test]
            fn $test() {
                run_kernel($kernel);
            });
        )*
    };
}

golden_gradient_tests! {
    golden_grads_reference => Kernel::Reference,
    golden_grads_auto => Kernel::Auto,
    golden_grads_flash_avx512 [avx512] => Kernel::Flash(Isa::Avx512),
    golden_grads_flash_avx2 [avx2] => Kernel::Flash(Isa::Avx2),
    golden_grads_flash_portable => Kernel::Flash(Isa::Portable),
}

#[test]
fn every_kernel_has_a_golden_gradient_test() {
    let missing: Vec<_> = Kernel::ALL.iter().filter(|k| !TESTED.contains(k)).map(|k| k.name()).collect();
    assert!(missing.is_empty(), "kernels without a golden gradient test: {missing:?}");
}

#[test]
fn every_fixture_holds_gradients() {
    check_all(&[&|fx| grads_of(fx).map(|_| ())]);
}

#[test]
fn reference_backward_f64_matches_pytorch() {
    check_all(&[&check_reference_f64]);
}
