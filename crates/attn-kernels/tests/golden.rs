//! Golden tests: every kernel against attention computed by PyTorch in float64, stored in
//! `tests/fixtures/*.safetensors` by `scripts/gen_fixtures.py` (shapes at tile edges, GQA, every
//! mask kind, softcap, negative scale, fully masked rows, attention sinks).
//!
//! - The `f64` reference must match PyTorch to `1e-10 · (1 + magnitude)`.
//! - Each kernel of [`Kernel::ALL`] runs on the inputs cast to `f32` and must pass
//!   [`oracle::check`] against the fixture, with the `f32` reference on the same inputs as the
//!   baseline, with and without the weights requested, under every flash plan; and again with
//!   K/V stored as f16 and as bf16 (the oracle then runs on the rounded values).

use crate::common;
use crate::golden_parts;

use attn_kernels::{attention_tuned, reference, Isa, Kernel, KvView, Path, Tuning, View4};
use attn_testkit::oracle;
use golden_parts::compare::check_f64;
use golden_parts::fixture::{fixture_dir, fixture_paths, Fixture};
use half::{bf16, f16};

/// Fewer files than this means the directory was lost or truncated.
const MIN_FIXTURES: usize = 40;

fn load_all() -> Vec<Fixture> {
    fixture_paths().iter().map(|p| Fixture::load(p).unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// Runs `check` on every fixture and fails with every failure listed.
fn check_all(check: impl Fn(&Fixture) -> Result<(), String>) {
    let fixtures = load_all();
    let failures: Vec<String> = fixtures.iter().filter_map(|fx| check(fx).err()).collect();
    assert!(failures.is_empty(), "{} of {} fixtures failed:\n{}", failures.len(), fixtures.len(), failures.join("\n"));
}

fn check_reference_f64(fx: &Fixture) -> Result<(), String> {
    let [q, k, v] = fx.views([&fx.q.data, &fx.k.data, &fx.v.data])?;
    let params =
        fx.params(fx.bias.as_ref().map(|b| b.data.as_slice()), fx.sinks.as_ref().map(|s| s.data.as_slice()))?;
    let got = reference(&q, &k, &v, &params, true).map_err(|e| format!("{}: reference: {e}", fx.file))?;
    let weights = got.weights.ok_or_else(|| format!("{}: reference returned no weights", fx.file))?;
    check_f64(&format!("{}: out", fx.file), &got.out, &fx.out.data)?;
    check_f64(&format!("{}: lse", fx.file), &got.lse, &fx.lse.data)?;
    check_f64(&format!("{}: weights", fx.file), &weights, &fx.weights.data)
}

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&x| x as f32).collect()
}

/// Every plan of the flash kernel: automatic, each path forced, and each with the keys split.
const TUNINGS: [Tuning; 5] = [
    Tuning { path: None, shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Prefill), shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Decode), shards: None, ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Prefill), shards: Some(3), ..Tuning::DEFAULT },
    Tuning { path: Some(Path::Decode), shards: Some(3), ..Tuning::DEFAULT },
];

fn check_kernel(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    let (q32, k32, v32) = (to_f32(&fx.q.data), to_f32(&fx.k.data), to_f32(&fx.v.data));
    let (bias32, sinks32) = (fx.bias.as_ref().map(|b| to_f32(&b.data)), fx.sinks.as_ref().map(|s| to_f32(&s.data)));
    let [q, k, v] = fx.views([&q32, &k32, &v32])?;
    let params = fx.params(bias32.as_deref(), sinks32.as_deref())?;
    let naive = reference(&q, &k, &v, &params, true).map_err(|e| format!("{}: reference f32: {e}", fx.file))?;
    let naive_weights = naive.weights.as_deref().unwrap_or_default();
    let plans = if kernel == Kernel::Reference { &TUNINGS[..1] } else { &TUNINGS[..] };
    for (want_weights, tuning) in [true, false].into_iter().flat_map(|w| plans.iter().map(move |t| (w, *t))) {
        let tag =
            format!("{}: {} {tuning:?} (weights {})", fx.file, kernel.name(), if want_weights { "on" } else { "off" });
        let fast = attention_tuned(kernel, tuning, &q, &KvView::F32(k), &KvView::F32(v), &params, want_weights)
            .map_err(|e| format!("{tag}: {e}"))?;
        oracle::check(&format!("{tag}: out"), &fast.out, &fx.out.data, &naive.out, oracle::OUTPUT_FACTOR)?;
        oracle::check(&format!("{tag}: lse"), &fast.lse, &fx.lse.data, &naive.lse, oracle::OUTPUT_FACTOR)?;
        match (want_weights, fast.weights) {
            (true, Some(w)) => {
                oracle::check(&format!("{tag}: weights"), &w, &fx.weights.data, naive_weights, oracle::OUTPUT_FACTOR)?
            }
            (true, None) => return Err(format!("{tag}: weights requested but not returned")),
            (false, Some(_)) => return Err(format!("{tag}: weights returned but not requested")),
            (false, None) => {}
        }
    }
    Ok(())
}

/// Keys and values stored in half precision: the fixture's K/V rounded to `H`, the oracle the
/// `f64` reference on those rounded values, the baseline the `f32` reference on them, and the
/// kernel reading the `H` storage directly, under every plan.
fn check_kernel_half<H: Copy>(
    kernel: Kernel,
    fx: &Fixture,
    round: fn(f64) -> H,
    widen: fn(H) -> f32,
    view: for<'a> fn(View4<'a, H>) -> KvView<'a>,
) -> Result<(), String> {
    let rounded = |x: &[f64]| x.iter().map(|&x| round(x)).collect::<Vec<H>>();
    let (kh, vh) = (rounded(&fx.k.data), rounded(&fx.v.data));
    let widened = |x: &[H]| x.iter().map(|&x| widen(x)).collect::<Vec<f32>>();
    let (q32, k32, v32) = (to_f32(&fx.q.data), widened(&kh), widened(&vh));
    let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (q64, k64, v64) = (wide(&q32), wide(&k32), wide(&v32));
    let (bias32, sinks32) = (fx.bias.as_ref().map(|b| to_f32(&b.data)), fx.sinks.as_ref().map(|s| to_f32(&s.data)));
    let (bias64, sinks64) = (bias32.as_deref().map(wide), sinks32.as_deref().map(wide));
    let [q, k, v] = fx.views([&q32, &k32, &v32])?;
    let [qw, kw, vw] = fx.views([&q64, &k64, &v64])?;
    let params = fx.params(bias32.as_deref(), sinks32.as_deref())?;
    let fail = |e: attn_kernels::AttnError| format!("{}: {e}", fx.file);
    let oracle = reference(&qw, &kw, &vw, &fx.params(bias64.as_deref(), sinks64.as_deref())?, false).map_err(fail)?;
    let naive = reference(&q, &k, &v, &params, false).map_err(fail)?;
    let kv = View4::contiguous("k", &kh, k.dims()).map_err(fail)?;
    let vv = View4::contiguous("v", &vh, v.dims()).map_err(fail)?;
    for tuning in TUNINGS {
        let tag = format!("{}: {} {tuning:?} (half K/V)", fx.file, kernel.name());
        let fast = attention_tuned(kernel, tuning, &q, &view(kv), &view(vv), &params, false)
            .map_err(|e| format!("{tag}: {e}"))?;
        oracle::check(&format!("{tag}: out"), &fast.out, &oracle.out, &naive.out, oracle::OUTPUT_FACTOR)?;
        oracle::check(&format!("{tag}: lse"), &fast.lse, &oracle.lse, &naive.lse, oracle::OUTPUT_FACTOR)?;
    }
    Ok(())
}

// The closures give the constructors the higher-ranked type `check_kernel_half` needs.
#[allow(clippy::redundant_closure)]
fn check_kernel_f16(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    check_kernel_half(kernel, fx, f16::from_f64, f16::to_f32, |v| KvView::F16(v))
}

#[allow(clippy::redundant_closure)]
fn check_kernel_bf16(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    check_kernel_half(kernel, fx, bf16::from_f64, bf16::to_f32, |v| KvView::Bf16(v))
}

fn run_kernel(kernel: Kernel) {
    common::assert_available(kernel);
    check_all(|fx| check_kernel(kernel, fx));
    check_all(|fx| check_kernel_f16(kernel, fx));
    check_all(|fx| check_kernel_bf16(kernel, fx));
}

/// One `#[test]` per kernel (`[avx512]`/`[avx2]`: ignored where this machine lacks it, see
/// `common::isa_test!`), and the list of kernels so covered.
macro_rules! golden_tests {
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

golden_tests! {
    golden_reference => Kernel::Reference,
    golden_auto => Kernel::Auto,
    golden_flash_avx512 [avx512] => Kernel::Flash(Isa::Avx512),
    golden_flash_avx2 [avx2] => Kernel::Flash(Isa::Avx2),
    golden_flash_portable => Kernel::Flash(Isa::Portable),
}

#[test]
fn every_kernel_has_a_golden_test() {
    let missing: Vec<_> = Kernel::ALL.iter().filter(|k| !TESTED.contains(k)).map(|k| k.name()).collect();
    assert!(missing.is_empty(), "kernels without a golden test: {missing:?}");
}

#[test]
fn fixture_directory_is_populated() {
    let n = fixture_paths().len();
    assert!(n >= MIN_FIXTURES, "{}: {n} fixtures, expected at least {MIN_FIXTURES}", fixture_dir().display());
}

#[test]
fn reference_f64_matches_pytorch() {
    check_all(check_reference_f64);
}
