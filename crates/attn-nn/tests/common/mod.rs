//! Shared helpers of the module tests: seeded inputs, modules built on a fresh `VarMap`, and the
//! check that a loss's backward reaches every parameter with a finite, non-zero gradient.

#![allow(dead_code)]

use attn::Mask;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

/// Uniform in `[-1, 1)`, a pure function of `(shape, seed)`.
pub fn uniform(shape: &[usize], seed: u64) -> Tensor {
    attn::random::uniform(shape, -1.0, 1.0, seed).unwrap()
}

/// A tracked input of `shape`.
pub fn input(shape: &[usize], seed: u64) -> Var {
    Var::from_tensor(&uniform(shape, seed)).unwrap()
}

/// A fresh `VarMap` and a seeded f32 CPU `VarBuilder` over it (the same model on every run).
pub fn fresh() -> (VarMap, VarBuilder<'static>) {
    let map = VarMap::new();
    let vb = attn_nn::init::seeded(&map, 7);
    (map, vb)
}

/// PyTorch's key padding mask (true = padding) `[B, L]` with `lens[b]` real tokens.
pub fn padding(lens: &[usize], l: usize) -> Mask {
    let data: Vec<u8> = lens.iter().flat_map(|&n| (0..l).map(move |j| u8::from(j >= n))).collect();
    Mask::block(Tensor::from_vec(data, (lens.len(), l), &Device::Cpu).unwrap())
}

/// Flattened `f32` values.
pub fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// `Σ out·G` with a fixed random `G` of `out`'s shape.
pub fn loss(out: &Tensor) -> Tensor {
    let g = uniform(out.dims(), 999);
    (out * g).unwrap().sum_all().unwrap()
}

/// Backpropagates `loss` and checks that every variable of `map` (and every extra input) got a
/// finite gradient with at least one non-zero entry; the error names the first that did not.
pub fn every_param_trains(map: &VarMap, inputs: &[(&str, &Var)], loss: &Tensor) -> Result<usize, String> {
    let grads = loss.backward().map_err(|e| e.to_string())?;
    let vars = map.data().lock().unwrap().clone();
    let mut names: Vec<_> = vars.keys().cloned().collect();
    names.sort();
    if names.is_empty() {
        return Err("the module has no parameters".into());
    }
    let all = names.iter().map(|n| (n.as_str(), &vars[n])).chain(inputs.iter().copied());
    let mut checked = 0;
    for (name, var) in all {
        let g = grads.get(var).ok_or_else(|| format!("{name}: no gradient reached it"))?;
        let g = flat(g);
        if g.iter().any(|x| !x.is_finite()) {
            return Err(format!("{name}: a gradient is not finite"));
        }
        if g.iter().all(|&x| x == 0.0) {
            return Err(format!("{name}: every gradient entry is zero"));
        }
        checked += 1;
    }
    Ok(checked)
}
