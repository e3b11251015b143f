//! The fused operations against the same formulas composed from candle's differentiable ops, in
//! `f64`: forward values and every gradient, plus ReLU's PyTorch semantics (zero gradient at 0,
//! NaN kept), dropout's mask equal to the serial stream's on any thread count, the linear map's gradients for tracked arguments only, and the scheduling-independence
//! of the sums over rows in LayerNorm's and the linear map's gradients; the linear map with
//! bfloat16 products against the composed formula on the rounded operands; GELU against candle's
//! `gelu_erf` in f64 and under the oracle rule in f32.

use attn::random::SplitMix64;
use attn_nn::fused::{dropout, gelu, layer_norm, linear, relu, Approximate};
use attn_nn::Linear;
use candle_core::{DType, Device, Tensor, Var, D};

fn random(shape: &[usize], seed: u64) -> Tensor {
    attn::random::uniform(shape, -2.0, 2.0, seed).unwrap().to_dtype(DType::F64).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    a.sub(b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
}

/// LayerNorm as candle's elementary ops compute it (differentiated by candle).
fn composed_layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    let mean = x.mean_keepdim(D::Minus1).unwrap();
    let centred = x.broadcast_sub(&mean).unwrap();
    let var = centred.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let normed = centred.broadcast_div(&(var + eps).unwrap().sqrt().unwrap()).unwrap();
    normed.broadcast_mul(w).unwrap().broadcast_add(b).unwrap()
}

/// The gradients of `Σ f(args)·g` with respect to each of `args`.
fn grads(args: &[Tensor], g: &Tensor, f: impl Fn(&[Tensor]) -> Tensor) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = args.iter().map(|a| Var::from_tensor(a).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ts);
    let store = y.mul(g).unwrap().sum_all().unwrap().backward().unwrap();
    (y, ts.iter().map(|t| store.get(t).expect("gradient reaches every argument").clone()).collect())
}

#[test]
fn layer_norm_matches_the_composed_formula_with_gradients() {
    for (shape, eps) in [(vec![3, 5, 17], 1e-5), (vec![40, 64], 1e-6), (vec![1, 1, 1], 1e-5), (vec![2, 130, 8], 0.1)] {
        let d = *shape.last().unwrap();
        let (x, w, b) = (random(&shape, 1), random(&[d], 2), random(&[d], 3));
        let g = random(&shape, 4);
        let args = [x, w, b];
        let (y_f, d_f) = grads(&args, &g, |a| layer_norm(&a[0], &a[1], &a[2], eps).unwrap());
        let (y_c, d_c) = grads(&args, &g, |a| composed_layer_norm(&a[0], &a[1], &a[2], eps));
        assert!(max_diff(&y_f, &y_c) < 1e-12, "{shape:?} forward");
        for (name, (f, c)) in ["dx", "dweight", "dbias"].iter().zip(d_f.iter().zip(&d_c)) {
            assert!(max_diff(f, c) < 1e-10, "{shape:?} {name}: {}", max_diff(f, c));
        }
    }
}

#[test]
fn layer_norm_reads_strided_and_f32_inputs() {
    let x = random(&[6, 16], 5);
    let (w, b) = (random(&[6], 6), random(&[6], 7));
    let strided = x.t().unwrap(); // [16, 6], not contiguous
    let want = composed_layer_norm(&strided.contiguous().unwrap(), &w, &b, 1e-5);
    assert!(max_diff(&layer_norm(&strided, &w, &b, 1e-5).unwrap(), &want) < 1e-12);
    let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let got = layer_norm(&f32(&strided), &f32(&w), &f32(&b), 1e-5).unwrap();
    assert_eq!(got.dtype(), DType::F32);
    assert!(max_diff(&got.to_dtype(DType::F64).unwrap(), &want) < 1e-5);
}

/// Runs `f` in a rayon pool of `threads` threads.
fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(f)
}

#[test]
fn sums_over_rows_do_not_depend_on_the_thread_count() {
    let (x, w, b, g) = (random(&[700, 32], 8), random(&[32], 9), random(&[32], 10), random(&[700, 32], 11));
    let args = [x, w, b];
    let norm = |t| with_threads(t, || grads(&args, &g, |a| layer_norm(&a[0], &a[1], &a[2], 1e-5).unwrap()).1);
    let lin_args = [args[0].clone(), random(&[24, 32], 18), random(&[24], 19)];
    let g24 = random(&[700, 24], 25);
    let lin = |t| with_threads(t, || grads(&lin_args, &g24, |a| linear(&a[0], &a[1], Some(&a[2])).unwrap()).1);
    for (one, four) in [(norm(1), norm(4)), (lin(1), lin(4))] {
        for (a, b) in one.iter().zip(&four) {
            assert_eq!(max_diff(a, b), 0.0);
        }
    }
}

/// `x·wᵀ + b` composed from candle's ops (differentiated by candle).
fn composed_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let (lead, inn) = x.dims().split_at(x.rank() - 1);
    let y = x.reshape((lead.iter().product::<usize>(), inn[0])).unwrap().matmul(&w.t().unwrap()).unwrap();
    let y = b.map_or(y.clone(), |b| y.broadcast_add(b).unwrap());
    y.reshape([lead, &[w.dim(0).unwrap()]].concat()).unwrap()
}

#[test]
fn linear_matches_the_composed_formula_with_gradients() {
    // Shapes: leading dimensions folded, rows past one task and one gemm block, a single element;
    // single rows (the matrix-vector path) with a width not a multiple of its 16 lanes, past one
    // task of output rows.
    let shapes = [
        (vec![2, 3, 4, 5], 7),
        (vec![700, 32], 48),
        (vec![1, 1], 1),
        (vec![9], 3),
        (vec![1, 1, 37], 1100),
        (vec![53], 2100),
    ];
    for (x_shape, out) in shapes {
        let inn = *x_shape.last().unwrap();
        let (x, w, b) = (random(&x_shape, 20), random(&[out, inn], 21), random(&[out], 22));
        let g = random(&[&x_shape[..x_shape.len() - 1], &[out]].concat(), 23);
        let (y_f, d_f) = grads(&[x.clone(), w.clone(), b.clone()], &g, |a| linear(&a[0], &a[1], Some(&a[2])).unwrap());
        let (y_c, d_c) = grads(&[x.clone(), w.clone(), b], &g, |a| composed_linear(&a[0], &a[1], Some(&a[2])));
        assert!(max_diff(&y_f, &y_c) < 1e-12, "{x_shape:?} forward");
        for (name, (f, c)) in ["dx", "dweight", "dbias"].iter().zip(d_f.iter().zip(&d_c)) {
            assert!(max_diff(f, c) < 1e-12, "{x_shape:?} {name}: {}", max_diff(f, c));
        }
        let (y_f, d_f) = grads(&[x.clone(), w.clone()], &g, |a| linear(&a[0], &a[1], None).unwrap());
        let (y_c, d_c) = grads(&[x, w], &g, |a| composed_linear(&a[0], &a[1], None));
        assert!(max_diff(&y_f, &y_c) < 1e-12, "{x_shape:?} forward without bias");
        for (f, c) in d_f.iter().zip(&d_c) {
            assert!(max_diff(f, c) < 1e-12, "{x_shape:?} without bias");
        }
    }
}

/// `t` rounded to bfloat16 (to nearest, ties to even) and back, in `f64`.
fn bf16_rounded(t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F64).unwrap()
}

/// `w: [out, in]` as `Linear::with_int8_products` multiplies it, in `f64`: each block of 32
/// inputs of a row quantized to 8 bits over its range (`s = (max − min) / 255`,
/// `q = round((w − min) / s)`), `min + q·s` (never rounded to bfloat16).
fn int8_rounded(w: &Tensor) -> Tensor {
    let inn = w.dim(1).unwrap();
    let rows: Vec<Vec<f32>> = w.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
    let mut out = Vec::with_capacity(rows.len() * inn);
    for row in rows {
        for block in row.chunks(32) {
            let (min, max) = block.iter().fold((f32::MAX, f32::MIN), |(a, z), &x| (a.min(x), z.max(x)));
            let s = (max - min) / 255.0;
            // The kernel keeps the level less 128 and the minimum plus 128 steps, and widens by an FMA.
            let level = |x: f32| if s > 0.0 { ((x - min) / s).round().min(255.0) } else { 128.0 };
            out.extend(block.iter().map(|&x| (level(x) - 128.0).mul_add(s, min + 128.0 * s)));
        }
    }
    Tensor::from_vec(out, w.shape(), w.device()).unwrap().to_dtype(DType::F64).unwrap()
}

/// A linear layer with products in bfloat16, its weight stored by `storage` (`bf16` or `int8`).
fn low_precision(layer: Linear, storage: &str) -> Linear {
    match storage {
        "bf16" => layer.with_bf16_products(),
        _ => layer.with_int8_products(),
    }
    .unwrap()
}

#[test]
fn linear_with_bf16_products_is_the_product_of_the_rounded_operands_with_gradients() {
    // A decode row, a few rows, rows past one micro-kernel chunk, odd widths, outputs past one panel.
    for storage in ["bf16", "int8"] {
        let rounded_weight = if storage == "bf16" { bf16_rounded } else { int8_rounded };
        for (x_shape, out) in [(vec![1, 64], 40), (vec![3, 2, 33], 7), (vec![29, 130], 70)] {
            let inn = *x_shape.last().unwrap();
            let (x, w, b) = (random(&x_shape, 40), random(&[out, inn], 41), random(&[out], 42));
            let g = random(&[&x_shape[..x_shape.len() - 1], &[out]].concat(), 43);
            let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let (x32, w32, b32) = (f32s(&x), f32s(&w), f32s(&b));
            let layer = Linear::new(
                Var::from_tensor(&w32).unwrap().as_tensor().clone(),
                Some(Var::from_tensor(&b32).unwrap().as_tensor().clone()),
            );
            let layer = low_precision(layer, storage);
            let xv = Var::from_tensor(&x32).unwrap();
            let y = layer.forward(xv.as_tensor()).unwrap();
            let store = y.mul(&f32s(&g)).unwrap().sum_all().unwrap().backward().unwrap();
            let want = composed_linear(&bf16_rounded(&x), &rounded_weight(&w), Some(&b));
            // f32 sums of exact products (terms within ±4), far below what rounding the operands to
            // bfloat16 moves a sum (~√in · 4 · 2⁻⁸).
            let tol = 1e-4 * inn as f64;
            assert!(max_diff(&y.to_dtype(DType::F64).unwrap(), &want) < tol, "{storage} {x_shape:?} forward");
            let grad =
                |t: &Tensor| store.get(t).expect("gradient reaches every argument").to_dtype(DType::F64).unwrap();
            let (_, d_c) = grads(&[x, rounded_weight(&w), b], &g, |a| composed_linear(&a[0], &a[1], Some(&a[2])));
            let got = [grad(xv.as_tensor()), grad(layer.weight()), grad(layer.bias().unwrap())];
            for (name, (f, c)) in ["dx", "dweight", "dbias"].iter().zip(got.iter().zip(&d_c)) {
                assert!(max_diff(f, c) < 1e-3, "{storage} {x_shape:?} {name}: {}", max_diff(f, c));
            }
        }
    }
}

#[test]
fn linear_gives_no_gradient_to_a_constant_input() {
    let (x, w, b, g) = (random(&[6, 5], 26), random(&[4, 5], 27), random(&[4], 28), random(&[6, 4], 29));
    let (wv, bv) = (Var::from_tensor(&w).unwrap(), Var::from_tensor(&b).unwrap());
    let store = linear(&x, wv.as_tensor(), Some(bv.as_tensor())).unwrap().mul(&g).unwrap().sum_all().unwrap();
    let store = store.backward().unwrap();
    assert!(store.get(&x).is_none(), "a constant input gets no gradient");
    let want_dw = g.t().unwrap().matmul(&x).unwrap();
    assert!(max_diff(store.get(wv.as_tensor()).unwrap(), &want_dw) < 1e-12);
    assert!(max_diff(store.get(bv.as_tensor()).unwrap(), &g.sum(0).unwrap()) < 1e-12);
}

#[test]
fn linear_reads_strided_f32_and_empty_inputs() {
    let (w, b) = (random(&[3, 6], 30), random(&[3], 31));
    let strided = random(&[6, 16], 32).t().unwrap(); // [16, 6], not contiguous
    let want = composed_linear(&strided.contiguous().unwrap(), &w, Some(&b));
    assert!(max_diff(&linear(&strided, &w, Some(&b)).unwrap(), &want) < 1e-12);
    let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let got = linear(&f32(&strided), &f32(&w), Some(&f32(&b))).unwrap();
    assert_eq!(got.dtype(), DType::F32);
    assert!(max_diff(&got.to_dtype(DType::F64).unwrap(), &want) < 1e-5);
    // No rows: an empty output, and zero weight and bias gradients.
    let (y, d) = grads(&[random(&[0, 6], 33), w.clone(), b.clone()], &random(&[0, 3], 34), |a| {
        linear(&a[0], &a[1], Some(&a[2])).unwrap()
    });
    assert_eq!(y.dims(), [0, 3]);
    assert_eq!(
        (d[1].abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap(), d[1].dims()),
        (0.0, &[3usize, 6][..])
    );
    assert_eq!(d[2].to_vec1::<f64>().unwrap(), [0.0; 3]);
    // No input features: every row is the bias.
    let y = linear(&random(&[2, 0], 35), &random(&[3, 0], 36), Some(&b)).unwrap();
    assert_eq!(max_diff(&y, &b.unsqueeze(0).unwrap().repeat((2, 1)).unwrap()), 0.0);
}

#[test]
fn linear_refuses_mismatched_shapes() {
    let err = linear(&random(&[3, 4], 37), &random(&[2, 5], 38), None).unwrap_err().to_string();
    assert!(err.contains("input [3, 4] against weight [2, 5]"), "{err}");
    let err = linear(&random(&[3, 5], 37), &random(&[2, 5], 38), Some(&random(&[3], 39))).unwrap_err().to_string();
    assert!(err.contains("bias [3]: expected [.., 5] and [2]"), "{err}");
}

#[test]
fn relu_matches_pytorch_semantics() {
    let x = Tensor::new(&[-1.5f64, 0.0, 2.0, f64::NAN, -0.0, 3.0], &Device::Cpu).unwrap();
    let g = Tensor::new(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &Device::Cpu).unwrap();
    let (y, d) = grads(&[x], &g, |a| relu(&a[0]).unwrap());
    let y = y.to_vec1::<f64>().unwrap();
    assert_eq!((y[0], y[1], y[2], y[4], y[5]), (0.0, 0.0, 2.0, 0.0, 3.0));
    assert!(y[3].is_nan(), "NaN shows through relu");
    // PyTorch: the gradient passes where the output is positive only (0 at x = 0).
    assert_eq!(d[0].to_vec1::<f64>().unwrap(), [0.0, 0.0, 3.0, 0.0, 0.0, 6.0]);
}

#[test]
fn relu_large_input_matches_candle() {
    let x = random(&[3, 50_000], 12);
    let g = random(&[3, 50_000], 13);
    let (y_f, d_f) = grads(std::slice::from_ref(&x), &g, |a| relu(&a[0]).unwrap());
    let (y_c, _) = grads(std::slice::from_ref(&x), &g, |a| a[0].relu().unwrap());
    assert_eq!(max_diff(&y_f, &y_c), 0.0);
    let want = g.mul(&x.gt(0.0).unwrap().to_dtype(DType::F64).unwrap()).unwrap();
    assert_eq!(max_diff(&d_f[0], &want), 0.0);
}

#[test]
fn linear_folds_leading_dimensions_with_the_same_gradients() {
    let (x, w, b) = (random(&[2, 3, 4, 5], 14), random(&[7, 5], 15), random(&[7], 16));
    let g = random(&[2, 3, 4, 7], 17);
    let (y_f, d_f) = grads(&[x.clone(), w.clone(), b.clone()], &g, |a| {
        Linear::new(a[1].clone(), Some(a[2].clone())).forward(&a[0]).unwrap()
    });
    let (y_c, d_c) = grads(&[x, w, b], &g, |a| {
        candle_nn::Module::forward(&candle_nn::Linear::new(a[1].clone(), Some(a[2].clone())), &a[0]).unwrap()
    });
    assert!(max_diff(&y_f, &y_c) < 1e-12);
    for (f, c) in d_f.iter().zip(&d_c) {
        assert!(max_diff(f, c) < 1e-12);
    }
}

/// Dropout as a product with the mask drawn serially from the stream.
fn serial_mask(n: usize, p: f32, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| if rng.unit_f32() >= p { f64::from(1.0 / (1.0 - p)) } else { 0.0 }).collect()
}

#[test]
fn dropout_draws_the_serial_streams_mask_on_any_thread_count() {
    // Sizes: within one task, and across several tasks with a ragged end.
    for (n, p, seed) in [(37, 0.5f32, 3u64), (3 * 16384 + 5, 0.1, 4)] {
        let (x, g) = (random(&[n], 40), random(&[n], 41));
        let mask = Tensor::new(serial_mask(n, p, seed), &Device::Cpu).unwrap();
        for threads in [1, 4] {
            let (y, d) =
                with_threads(threads, || grads(std::slice::from_ref(&x), &g, |a| dropout(&a[0], p, seed).unwrap()));
            assert_eq!(max_diff(&y, &x.mul(&mask).unwrap()), 0.0, "n {n}, {threads} threads: forward");
            assert_eq!(max_diff(&d[0], &g.mul(&mask).unwrap()), 0.0, "n {n}, {threads} threads: gradient");
        }
        let y32 = dropout(&x.to_dtype(DType::F32).unwrap(), p, seed).unwrap();
        assert_eq!(y32.dtype(), DType::F32);
        assert!(max_diff(&y32.to_dtype(DType::F64).unwrap(), &x.mul(&mask).unwrap()) < 1e-5);
    }
}

#[test]
fn dropout_keeps_nan_and_refuses_bad_probabilities() {
    let x = Tensor::new(&[f64::NAN; 64], &Device::Cpu).unwrap();
    let y = dropout(&x, 0.5, 9).unwrap().to_vec1::<f64>().unwrap();
    assert!(y.iter().all(|v| v.is_nan()), "a dropped NaN stays NaN, as in a mask product");
    for p in [1.0, -0.1, f32::NAN] {
        let err = dropout(&x, p, 9).unwrap_err().to_string();
        assert!(err.contains("outside [0, 1)"), "{p}: {err}");
    }
}

#[test]
fn gelu_matches_the_erf_formula_with_its_gradient() {
    // Far into both tails, where `1 + erf(x/√2)` cancels, and an odd length for the kernel's tail.
    let x = (random(&[7, 301], 60) * 4.0).unwrap();
    let g = random(&[7, 301], 61);
    let (y, d) = grads(std::slice::from_ref(&x), &g, |a| gelu(&a[0], Approximate::None).unwrap());
    let y_c = x.gelu_erf().unwrap();
    assert!(max_diff(&y, &y_c) < 1e-14, "f64 forward: {}", max_diff(&y, &y_c));
    // candle's own gradient rounds 1/√(2π) to 0.398942: the derivative composed exactly instead.
    let pdf = ((x.sqr().unwrap().neg().unwrap() / 2.0).unwrap().exp().unwrap() * 0.398_942_280_401_432_7).unwrap();
    let cdf = (((&x / 2f64.sqrt()).unwrap().erf().unwrap() + 1.0).unwrap() * 0.5).unwrap();
    let d_c = (cdf + (x.mul(&pdf).unwrap())).unwrap().mul(&g).unwrap();
    assert!(max_diff(&d[0], &d_c) < 1e-12, "f64 dx: {}", max_diff(&d[0], &d_c));
    // f32 under the oracle rule, naive32 being candle's f32 `gelu_erf` (PyTorch's formula).
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let (y32, d32) = grads(&[f32s(&x)], &f32s(&g), |a| gelu(&a[0], Approximate::None).unwrap());
    let (n32, nd32) = grads(&[f32s(&x)], &f32s(&g), |a| a[0].gelu_erf().unwrap());
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    for (what, fast, naive, want, k) in [("forward", &y32, &n32, &y, 2.0), ("dx", &d32[0], &nd32[0], &d_c, 3.0)] {
        let (err, naive_err) = (max_diff(&f64s(fast), want), max_diff(&f64s(naive), want));
        assert!(err <= k * naive_err + 1e-6, "f32 {what}: {err} against naive32's {naive_err}");
    }
}

#[test]
fn gelu_tanh_matches_candles_formula_with_its_gradient() {
    let x = (random(&[5, 203], 62) * 4.0).unwrap();
    let g = random(&[5, 203], 63);
    let (y, d) = grads(std::slice::from_ref(&x), &g, |a| gelu(&a[0], Approximate::Tanh).unwrap());
    let y_c = x.gelu().unwrap();
    assert!(max_diff(&y, &y_c) < 1e-14, "f64 forward: {}", max_diff(&y, &y_c));
    // The derivative composed exactly (candle's own gradient rounds its constants).
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let t = ((&x + (x.powf(3.0).unwrap() * 0.044715).unwrap()).unwrap() * c).unwrap().tanh().unwrap();
    let cdf = ((&t + 1.0).unwrap() * 0.5).unwrap();
    let slope = ((x.sqr().unwrap() * (3.0 * 0.044715)).unwrap() + 1.0).unwrap();
    let pdf = ((t.sqr().unwrap().neg().unwrap() + 1.0).unwrap() * (0.5 * c)).unwrap().mul(&slope).unwrap();
    let d_c = (cdf + x.mul(&pdf).unwrap()).unwrap().mul(&g).unwrap();
    assert!(max_diff(&d[0], &d_c) < 1e-12, "f64 dx: {}", max_diff(&d[0], &d_c));
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let y32 = gelu(&f32s(&x), Approximate::Tanh).unwrap().to_dtype(DType::F64).unwrap();
    let n32 = f32s(&x).gelu().unwrap().to_dtype(DType::F64).unwrap();
    let (err, naive_err) = (max_diff(&y32, &y), max_diff(&n32, &y));
    assert!(err <= 2.0 * naive_err + 1e-6, "f32 forward: {err} against naive32's {naive_err}");
}
