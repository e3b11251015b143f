//! Gradients through `attn::sdpa_full`'s log-sum-exp and weights (and `sdpa_varlen_full`'s
//! log-sum-exp): equal to the same loss through the textbook formula in candle's own `f64` ops,
//! to one kernel backward given every arriving gradient (with GQA, sinks, a tracked bias and
//! dropout), to the dense call per packed sequence; and a loss on the log-sum-exp alone gives the
//! values no gradient.

use attn::{cu_seqlens, sdpa_full, sdpa_varlen_full, SdpaOptions};
use attn_kernels::{attention, attention_backward, KvView, Saved, SideGrads, View4, WeightsGrad};
use candle_core::{DType, Device, Tensor, Var, D};

use crate::common;

use common::{flat, max_diff, uniform};

/// `max |got − want|` within `tol · max |want|`.
fn assert_close(name: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(got.iter().all(|x| x.is_finite()), "{name}: not finite");
    assert!(scale > 0.0, "{name}: the expected gradient is zero");
    let d = max_diff(got, want);
    assert!(d <= tol * scale, "{name}: off by {d} (largest {scale})");
}

/// Tracked copies of `ts`.
fn vars<T: std::borrow::Borrow<Tensor>>(ts: &[T]) -> Vec<Var> {
    ts.iter().map(|t| Var::from_tensor(t.borrow()).unwrap()).collect()
}

#[test]
fn lse_and_weights_gradients_equal_the_formula_in_candle_ops() {
    let (b, h, lq, lk, d) = (2, 2, 5, 7, 4);
    let (q0, k0, v0) = (uniform(&[b, h, lq, d], 1), uniform(&[b, h, lk, d], 2), uniform(&[b, h, lk, d], 3));
    let bias0 = uniform(&[lq, lk], 4);
    let (g_out, g_lse, g_w) = (uniform(&[b, h, lq, d], 5), uniform(&[b, h, lq], 6), uniform(&[b, h, lq, lk], 7));
    let loss = |out: &Tensor, lse: &Tensor, w: &Tensor| -> Tensor {
        let dt = out.dtype();
        let terms = [(out, &g_out), (lse, &g_lse), (w, &g_w)].map(|(x, g)| (x * g.to_dtype(dt).unwrap()).unwrap());
        terms.iter().map(|t| t.sum_all().unwrap()).reduce(|a, b| (a + b).unwrap()).unwrap()
    };

    // The formula in f64: causal (top-left) as an additive −1e9, `lse = log Σ exp(s)`,
    // `W = exp(s − lse)`, `out = W·V`.
    let wide = vars(&[&q0, &k0, &v0, &bias0].map(|t| t.to_dtype(DType::F64).unwrap()));
    let causal: Vec<f64> = (0..lq * lk).map(|e| if e % lk > e / lk { -1e9 } else { 0.0 }).collect();
    let causal = Tensor::from_vec(causal, (lq, lk), &Device::Cpu).unwrap();
    let s = (wide[0].matmul(&wide[1].t().unwrap()).unwrap() * (1.0 / (d as f64).sqrt())).unwrap();
    let s = s.broadcast_add(&(wide[3].as_tensor() + causal).unwrap()).unwrap();
    let lse = s.exp().unwrap().sum_keepdim(D::Minus1).unwrap().log().unwrap();
    let w = s.broadcast_sub(&lse).unwrap().exp().unwrap();
    let out = w.matmul(&wide[2]).unwrap();
    let want = loss(&out, &lse.squeeze(D::Minus1).unwrap(), &w).backward().unwrap();

    let ours = vars(&[&q0, &k0, &v0, &bias0]);
    let opts = SdpaOptions::default().causal(true).bias(ours[3].as_tensor().clone()).return_weights(true);
    let r = sdpa_full(&ours[0], &ours[1], &ours[2], &opts).unwrap();
    let got = loss(&r.out, &r.lse, r.weights.as_ref().unwrap()).backward().unwrap();
    for (name, o, w) in ["q", "k", "v", "bias"].into_iter().zip(&ours).zip(&wide).map(|((n, o), w)| (n, o, w)) {
        assert_close(name, &flat(got.get(o).unwrap()), &flat(want.get(w).unwrap()), 1e-5);
    }
}

#[test]
fn every_arriving_gradient_equals_one_kernel_backward() {
    let (b, hq, hkv, lq, lk, dk, dv) = (1, 4, 2, 9, 70, 8, 6);
    let (q0, k0, v0) = (uniform(&[b, hq, lq, dk], 11), uniform(&[b, hkv, lk, dk], 12), uniform(&[b, hkv, lk, dv], 13));
    let (bias0, sinks0) = (uniform(&[b, hq, lq, lk], 14), uniform(&[hq], 15));
    let (g_out, g_lse, g_w) = (uniform(&[b, hq, lq, dv], 16), uniform(&[b, hq, lq], 17), uniform(&[b, hq, lq, lk], 18));
    let x = vars(&[&q0, &k0, &v0, &bias0, &sinks0]);
    let opts = SdpaOptions::default()
        .bias(x[3].as_tensor().clone())
        .sinks(x[4].as_tensor().clone())
        .dropout(0.2, 5)
        .return_weights(true);
    let r = sdpa_full(&x[0], &x[1], &x[2], &opts).unwrap();
    let parts = [(&r.out, &g_out), (&r.lse, &g_lse), (r.weights.as_ref().unwrap(), &g_w)];
    let loss = parts.map(|(t, g)| (t * g).unwrap().sum_all().unwrap());
    let grads = (&loss[0] + (&loss[1] + &loss[2]).unwrap()).unwrap().backward().unwrap();

    let [qf, kf, vf, go, gl, gw] = [&q0, &k0, &v0, &g_out, &g_lse, &g_w].map(flat);
    let qv = View4::contiguous("q", &qf, [b, hq, lq, dk]).unwrap();
    let kv = KvView::F32(View4::contiguous("k", &kf, [b, hkv, lk, dk]).unwrap());
    let vv = KvView::F32(View4::contiguous("v", &vf, [b, hkv, lk, dv]).unwrap());
    let host = opts.kernel_params::<f32>().unwrap();
    let params = host.attn_params().unwrap();
    let fwd = attention(opts.kernel, &qv, &kv, &vv, &params, true).unwrap();
    let wdims = [b, hq, lq, lk];
    let weights = View4::contiguous("weights", fwd.weights.as_deref().unwrap(), wdims).unwrap();
    let side = SideGrads {
        dlse: Some(&gl),
        dweights: Some(WeightsGrad { weights, grad: View4::contiguous("grad_weights", &gw, wdims).unwrap() }),
    };
    let dout = View4::contiguous("grad_out", &go, [b, hq, lq, dv]).unwrap();
    let saved = Saved { side, ..Saved::of(&fwd, [b, hq, lq, dv], dout).unwrap() };
    let want = attention_backward(opts.kernel, &qv, &kv, &vv, &saved, &params, true).unwrap();
    let wants = [&want.dq, &want.dk, &want.dv, want.dbias.as_ref().unwrap(), want.dsinks.as_ref().unwrap()];
    for ((name, var), w) in ["q", "k", "v", "bias", "sinks"].into_iter().zip(&x).zip(wants) {
        assert_close(name, &flat(grads.get(var).unwrap()), w, 1e-5);
    }
}

#[test]
fn a_loss_on_the_log_sum_exp_alone_gives_the_values_none() {
    let x = vars(&[&uniform(&[1, 2, 6, 4], 21), &uniform(&[1, 2, 8, 4], 22), &uniform(&[1, 2, 8, 3], 23)]);
    let r = sdpa_full(&x[0], &x[1], &x[2], &SdpaOptions::default().causal(true)).unwrap();
    let grads = r.lse.sum_all().unwrap().backward().unwrap();
    let (dq, dv) = (flat(grads.get(&x[0]).unwrap()), flat(grads.get(&x[2]).unwrap()));
    assert!(dq.iter().all(|x| x.is_finite()) && dq.iter().any(|&x| x != 0.0), "dq: {dq:?}");
    assert!(dv.iter().all(|&x| x == 0.0), "the log-sum-exp does not read the values: dv {dv:?}");
}

#[test]
fn packed_lse_gradients_equal_the_dense_ones_per_sequence() {
    let (lens, hq, hkv, d) = ([5usize, 9, 3], 2, 1, 4);
    let total: usize = lens.iter().sum();
    let cu = cu_seqlens(&lens);
    let (q0, k0, v0) = (uniform(&[total, hq, d], 31), uniform(&[total, hkv, d], 32), uniform(&[total, hkv, d], 33));
    let (g_out, g_lse) = (uniform(&[total, hq, d], 34), uniform(&[hq, total], 35));
    let opts = SdpaOptions::default().causal(true);
    let x = vars(&[&q0, &k0, &v0]);
    let r = sdpa_varlen_full(&x[0], &x[1], &x[2], &cu, &cu, &opts).unwrap();
    let loss = ((&r.out * &g_out).unwrap().sum_all().unwrap() + (&r.lse * &g_lse).unwrap().sum_all().unwrap()).unwrap();
    let packed = loss.backward().unwrap();
    for (s, w) in cu.windows(2).enumerate() {
        let n = w[1] - w[0];
        // One sequence as a dense `[1, H, L, D]` call.
        let seq = |t: &Tensor| t.narrow(0, w[0], n).unwrap().transpose(0, 1).unwrap().unsqueeze(0).unwrap();
        let y = vars(&[&seq(&q0), &seq(&k0), &seq(&v0)]);
        let rd = sdpa_full(&y[0], &y[1], &y[2], &opts).unwrap();
        let gl = g_lse.narrow(1, w[0], n).unwrap().unsqueeze(0).unwrap();
        let dl =
            ((&rd.out * seq(&g_out)).unwrap().sum_all().unwrap() + (&rd.lse * gl).unwrap().sum_all().unwrap()).unwrap();
        let dense = dl.backward().unwrap();
        for (name, xp, yd) in [("q", &x[0], &y[0]), ("k", &x[1], &y[1]), ("v", &x[2], &y[2])] {
            let got = flat(&seq(packed.get(xp).unwrap()));
            assert_close(&format!("sequence {s} d{name}"), &got, &flat(dense.get(yd).unwrap()), 1e-6);
        }
    }
}
