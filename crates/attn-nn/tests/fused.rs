//! The fused operations against the same formulas composed from candle's differentiable ops, in
//! `f64`: forward values and every gradient, plus ReLU's PyTorch semantics (zero gradient at 0,
//! NaN kept) and the scheduling-independence of the sums over rows in LayerNorm's and the bias's
//! gradients.

use attn_nn::fused::{add_bias, layer_norm, relu};
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
    let bias =
        |t| with_threads(t, || grads(&[args[0].clone(), args[2].clone()], &g, |a| add_bias(&a[0], &a[1]).unwrap()).1);
    for (one, four) in [(norm(1), norm(4)), (bias(1), bias(4))] {
        for (a, b) in one.iter().zip(&four) {
            assert_eq!(max_diff(a, b), 0.0);
        }
    }
}

#[test]
fn add_bias_matches_broadcast_add_with_gradients() {
    for shape in [vec![700, 32], vec![2, 3, 5], vec![1, 1]] {
        let n = *shape.last().unwrap();
        let (y, b, g) = (random(&shape, 20), random(&[n], 21), random(&shape, 22));
        let args = [y, b];
        let (out_f, d_f) = grads(&args, &g, |a| add_bias(&a[0], &a[1]).unwrap());
        let (out_c, d_c) = grads(&args, &g, |a| a[0].broadcast_add(&a[1]).unwrap());
        assert_eq!(max_diff(&out_f, &out_c), 0.0, "{shape:?} forward");
        assert_eq!(max_diff(&d_f[0], &d_c[0]), 0.0, "{shape:?} dy");
        assert!(max_diff(&d_f[1], &d_c[1]) < 1e-12, "{shape:?} dbias");
    }
    let err = add_bias(&random(&[3, 4], 23), &random(&[5], 24)).unwrap_err().to_string();
    assert!(err.contains("bias [5] must be [4]"), "{err}");
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
