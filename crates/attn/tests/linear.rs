//! `attn::linear_attention` on candle tensors: its output and the gradients candle's autograd
//! delivers to `q`, `k`, `v` equal the naive oracle's (`f64`, every map, causal and not, grouped
//! heads, padding), `f32` inputs compute in `f32`, and bad inputs are typed errors.

use attn::linear::{linear_attention, FeatureMap, LinearOptions};
use attn::{AttnError, AttnLibError};
use attn_kernels::linear::{linear_reference, linear_reference_backward};
use attn_kernels::View4;
use candle_core::{DType, Device, Tensor, Var};

fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap()
}

fn view<'a>(name: &'static str, x: &'a [f64], dims: [usize; 4]) -> View4<'a, f64> {
    View4::contiguous(name, x, dims).unwrap()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[test]
fn output_and_autograd_gradients_equal_the_oracle() {
    let (b, hq, hkv, l, d, dv) = (2, 4, 2, 11, 6, 5);
    let maps = [FeatureMap::Elu, FeatureMap::Relu, LinearOptions::favor(d, 16, 3).unwrap().map];
    for map in maps {
        for causal in [false, true] {
            let opts = LinearOptions::new(map.clone()).causal(causal).key_lengths(vec![l, 7]).chunk(4);
            let x = |shape: &[usize], seed| {
                attn::random::uniform(shape, -0.5, 0.5, seed).unwrap().to_dtype(DType::F64).unwrap()
            };
            let (q, k, v) = (
                Var::from_tensor(&x(&[b, hq, l, d], 1)).unwrap(),
                Var::from_tensor(&x(&[b, hkv, l, d], 2)).unwrap(),
                Var::from_tensor(&x(&[b, hkv, l, dv], 3)).unwrap(),
            );
            let dout = x(&[b, hq, l, dv], 4);
            let out = linear_attention(&q, &k, &v, &opts).unwrap();
            assert_eq!(out.dtype(), DType::F64);
            let grads = (&out * &dout).unwrap().sum_all().unwrap().backward().unwrap();

            let (qs, ks, vs, gs) = (values(&q), values(&k), values(&v), values(&dout));
            let (qv, kv, vv) =
                (view("q", &qs, [b, hq, l, d]), view("k", &ks, [b, hkv, l, d]), view("v", &vs, [b, hkv, l, dv]));
            let want = linear_reference(qv, kv, vv, &opts.params()).unwrap();
            assert!(max_diff(&values(&out), &want) < 1e-12);
            let g = linear_reference_backward(qv, kv, vv, view("dout", &gs, [b, hq, l, dv]), &opts.params()).unwrap();
            for (t, want) in [(&q, &g.dq), (&k, &g.dk), (&v, &g.dv)] {
                let got = values(grads.get(t).expect("a gradient"));
                assert!(max_diff(&got, want) < 1e-10, "{} causal {causal}: {}", map.name(), max_diff(&got, want));
                assert!(got.iter().all(|x| x.is_finite()) && got.iter().any(|&x| x != 0.0));
            }
        }
    }
}

#[test]
fn f32_inputs_compute_in_f32_and_bad_inputs_are_typed_errors() {
    let q = attn::random::uniform(&[1, 2, 8, 4], -1.0, 1.0, 1).unwrap();
    let out = linear_attention(&q, &q, &q, &LinearOptions::new(FeatureMap::Elu).causal(true)).unwrap();
    assert_eq!((out.dtype(), out.dims()), (DType::F32, &[1, 2, 8, 4][..]));

    let k = Tensor::zeros((1, 2, 5, 4), DType::F32, &Device::Cpu).unwrap();
    let e = linear_attention(&q, &k, &q, &LinearOptions::new(FeatureMap::Elu)).unwrap_err();
    assert!(
        matches!(e, AttnLibError::Kernel(AttnError::DimMismatch { tensor: "v", dim: "L", expected: 5, found: 8 })),
        "{e}"
    );
    let e = linear_attention(&q, &q, &q, &LinearOptions::new(FeatureMap::Elu).eps(-1.0)).unwrap_err();
    assert!(matches!(e, AttnLibError::Kernel(AttnError::Param { field: "eps", .. })), "{e}");
    let e = LinearOptions::favor(4, 0, 1).unwrap_err();
    assert!(matches!(e, AttnLibError::Kernel(AttnError::Param { field: "features", .. })), "{e}");
    let e = linear_attention(&q.flatten_to(1).unwrap(), &q, &q, &LinearOptions::new(FeatureMap::Elu)).unwrap_err();
    assert!(matches!(e, AttnLibError::Shape { tensor: "q", .. }), "{e}");
}
