//! Running a module fixture and judging the result: [`compute`] builds the module from the
//! fixture's state dict and returns its output and every gradient, [`compare`] and [`report`]
//! apply the oracle rule and the `f32` budget against the fixture's float64 values.

use std::collections::{BTreeMap, BTreeSet};

use attn::Kernel;
use attn_nn::StateDict;
use attn_testkit::oracle;
use candle_core::{DType, Device, Tensor};

use super::fixture::Fixture;
use super::models::{build, err, param_tensors, Inputs};

/// Bound on `max|naive32 − ref64| / max|ref64|`: what computing in `f32` may cost. A module that
/// disagrees with PyTorch is off by more (a tanh-approximate GELU instead of the exact one: 8e-5).
pub const F32_BUDGET: f64 = 2e-5;
/// A run's results by fixture name (`out`, `weights`, `grad.input.<x>`, `grad.param.<p>`):
/// shape and row-major values.
pub type Results = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

pub fn flat(t: &Tensor) -> Result<(Vec<usize>, Vec<f32>), String> {
    Ok((t.dims().to_vec(), t.flatten_all().and_then(|t| t.to_dtype(DType::F32)?.to_vec1()).map_err(err)?))
}

/// How a module runs on a fixture's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// The padded inputs with the fixture's masks (`Model::forward`).
    Padded,
    /// The real rows of each input packed (`Model::forward_packed`); only `tests/packed.rs` runs
    /// it, so the parity suite's binary never builds it.
    #[allow(dead_code)]
    Packed,
}

/// Loads the fixture's state dict into its module, built with `kernel`, through the library's
/// strict loader into trainable variables (a weight missing, mis-shaped or unused is refused by
/// name), and runs forward (on the `batch` form of the inputs) and backward.
pub fn compute(fx: &Fixture, kernel: Kernel, batch: Batch) -> Result<Results, String> {
    let state_dict = StateDict::from_tensors(param_tensors(fx)?.into_iter().collect(), fx.name.clone());
    let loaded = state_dict
        .build_trainable(DType::F32, &Device::Cpu, |vb| build(fx, kernel, vb).map_err(anyhow::Error::msg))
        .map_err(|e| format!("{}: {e}", fx.name))?;
    let (model, vars) = (&loaded.module, loaded.named_parameters());
    let inputs = Inputs::from_fixture(fx)?;
    let o = match batch {
        Batch::Padded => model.forward(&inputs)?,
        Batch::Packed => model.forward_packed(&inputs)?,
    };
    let mut results = Results::new();
    results.insert("out".into(), flat(&o.out)?);
    if let Some(w) = &o.weights {
        results.insert("weights".into(), flat(w)?);
    }
    let grads = (&o.out * fx.f32_tensor("grad_out")?).and_then(|l| l.sum_all()?.backward()).map_err(err)?;
    let inputs = inputs.vars().map(|(n, v)| (format!("grad.input.{n}"), v));
    for (name, var) in inputs.chain(vars.iter().map(|(n, v)| (format!("grad.param.{n}"), v))) {
        let g = grads.get(var.as_tensor()).ok_or_else(|| format!("{}: no gradient reaches `{name}`", fx.name))?;
        results.insert(name, flat(g)?);
    }
    Ok(results)
}

/// The worst use of the two bounds over one case's compared tensors.
#[derive(Debug, Default)]
pub struct Worst {
    /// `max|fast − ref64| / (factor · max|naive32 − ref64| + floor)` (≤ 1 passes the oracle).
    pub oracle: (f64, String),
    /// `max|naive32 − ref64| / max|ref64|` (≤ `F32_BUDGET` passes).
    pub f32_error: (f64, String),
}

fn max_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter().zip(want).fold(0.0, |m, (&g, &w)| m.max((g as f64 - w).abs()))
}

/// Checks every expected tensor of `fx` against the fast and naive runs; returns the failures.
pub fn compare(fx: &Fixture, fast: &Results, naive: &Results) -> (Vec<String>, Worst) {
    let expected: BTreeSet<&str> = fx
        .tensors
        .keys()
        .map(String::as_str)
        .filter(|n| *n == "out" || *n == "weights" || n.starts_with("grad."))
        .collect();
    let got: BTreeSet<&str> = fast.keys().map(String::as_str).collect();
    if expected != got {
        let msg = format!("{}: computed {got:?}, the fixture holds {expected:?}", fx.name);
        return (vec![msg], Worst::default());
    }
    let mut failures = Vec::new();
    let mut worst = Worst::default();
    for name in expected {
        let tag = format!("{}: {name}", fx.name);
        let (want, shape) = match (fx.f64s(name), fx.get(name)) {
            (Ok(w), Ok(s)) => (w, &s.shape),
            (Err(e), _) | (_, Err(e)) => {
                failures.push(e);
                continue;
            }
        };
        let ((fast_shape, f), (naive_shape, n)) = (&fast[name], &naive[name]);
        if fast_shape != shape || naive_shape != shape {
            failures
                .push(format!("{tag}: shape {fast_shape:?} (reference kernel {naive_shape:?}), expected {shape:?}"));
            continue;
        }
        let factor = if name.starts_with("grad.") { oracle::GRADIENT_FACTOR } else { oracle::OUTPUT_FACTOR };
        failures.extend(oracle::check(&tag, f, want, n, factor).err());
        let magnitude = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
        let naive_err = max_err(n, want);
        let floor = oracle::FLOOR_ULPS * magnitude.max(f32::MIN_POSITIVE as f64) * f32::EPSILON as f64;
        let use_of_bound = max_err(f, want) / (factor * naive_err + floor);
        let f32_error = naive_err / magnitude.max(f64::MIN_POSITIVE);
        if f32_error > F32_BUDGET {
            failures.push(format!(
                "{tag}: the module disagrees with PyTorch: max error {naive_err:e} with the reference kernel is \
                 {f32_error:e} of the magnitude {magnitude:e} (budget {F32_BUDGET:e})"
            ));
        }
        if use_of_bound > worst.oracle.0 {
            worst.oracle = (use_of_bound, name.to_string());
        }
        if f32_error > worst.f32_error.0 {
            worst.f32_error = (f32_error, name.to_string());
        }
    }
    (failures, worst)
}

/// Compares `fast` and `naive` with the fixture, prints the worst ratios, and returns the failures
/// joined.
pub fn report(fx: &Fixture, fast: &Results, naive: &Results) -> Result<(), String> {
    let (failures, worst) = compare(fx, fast, naive);
    println!(
        "{}: oracle bound used {:.3} ({}), f32 error {:.2e} ({})",
        fx.name, worst.oracle.0, worst.oracle.1, worst.f32_error.0, worst.f32_error.1
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
