//! Reproducible parameter initialisation: a `VarBuilder` over a [`VarMap`] that creates each
//! missing variable from SplitMix64 keyed by `(seed, name)` following the module's `Init` hint
//! (PyTorch's schemes: constants, uniform, normal, Kaiming). candle's own `VarMap` draws from an
//! unseeded generator, so two runs would start from different models; with [`seeded`] the same
//! seed gives the same model on every machine, whatever order the modules are built in.

use attn::random::{splitmix64, SplitMix64};
use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::init::NormalOrUniform;
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

/// An `f32` CPU `VarBuilder` whose new variables are seeded and kept in `map` (for an optimiser
/// and for saving); variables already in `map` are returned as they are (shape-checked).
pub fn seeded(map: &VarMap, seed: u64) -> VarBuilder<'static> {
    VarBuilder::from_backend(Box::new(Seeded { map: map.clone(), seed }), DType::F32, Device::Cpu)
}

struct Seeded {
    map: VarMap,
    seed: u64,
}

impl SimpleBackend for Seeded {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        if self.contains_tensor(name) {
            return self.map.get(s, name, h, dtype, dev);
        }
        let key = name.bytes().fold(splitmix64(self.seed), |k, b| splitmix64(k ^ u64::from(b)));
        let values = draw(&s, h, &mut SplitMix64::new(key));
        let var = Var::from_tensor(&Tensor::from_vec(values, s, dev)?.to_dtype(dtype)?)?;
        self.map.data().lock().expect("the VarMap lock is not poisoned").insert(name.to_string(), var.clone());
        Ok(var.as_tensor().clone())
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        candle_core::bail!("{name}: a seeded VarBuilder needs the shape, use `get`")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.map.data().lock().expect("the VarMap lock is not poisoned").contains_key(name)
    }
}

/// `s.elem_count()` values drawn as `h` says.
fn draw(s: &Shape, h: Init, rng: &mut SplitMix64) -> Vec<f32> {
    let n = s.elem_count();
    let uniform = |rng: &mut SplitMix64, lo: f64, up: f64| -> Vec<f32> {
        (0..n).map(|_| (lo + (up - lo) * rng.unit_f64()) as f32).collect()
    };
    let normal = |rng: &mut SplitMix64, mean: f64, std: f64| -> Vec<f32> {
        // Box-Muller on (0, 1] × [0, 1).
        (0..n)
            .map(|_| {
                (mean
                    + std
                        * (-2.0 * (1.0 - rng.unit_f64()).ln()).sqrt()
                        * (std::f64::consts::TAU * rng.unit_f64()).cos()) as f32
            })
            .collect()
    };
    match h {
        Init::Const(c) => vec![c as f32; n],
        Init::Uniform { lo, up } => uniform(rng, lo, up),
        Init::Randn { mean, stdev } => normal(rng, mean, stdev),
        Init::Kaiming { dist, fan, non_linearity } => {
            let std = non_linearity.gain() / (fan.for_shape(s) as f64).sqrt();
            match dist {
                NormalOrUniform::Uniform => uniform(rng, -(3f64.sqrt()) * std, 3f64.sqrt() * std),
                NormalOrUniform::Normal => normal(rng, 0.0, std),
            }
        }
    }
}
