//! Score modifications through the library: T5's relative-position bias with a trainable table
//! (a `Var`) gives the output and gradients — the table's included — of the same bias gathered
//! from the table in candle and passed as an additive bias; it composes with tracked sinks and a
//! tracked bias (all three ride in the op's joined third argument); a table of the wrong length is
//! refused.

use std::sync::Arc;

use attn::score_mod::RelativeBias;
use attn::{random::uniform, sdpa, SdpaOptions};
use candle_core::{DType, Device, Tensor, Var};

const H: usize = 3;
const L: usize = 40;

fn t5() -> RelativeBias {
    RelativeBias { heads: H, buckets: 8, max_distance: 20, bidirectional: true }
}

/// `[1, H, L, L]`: `table[h, bucket(j − i)]` gathered in candle (differentiable in the table).
fn gathered(table: &Tensor) -> Tensor {
    let rb = t5();
    let mut idx = Vec::new();
    for h in 0..H {
        for i in 0..L {
            idx.extend((0..L).map(|j| (h * rb.buckets + rb.bucket(j as isize - i as isize)) as u32));
        }
    }
    let idx = Tensor::from_vec(idx, H * L * L, &Device::Cpu).unwrap();
    table.flatten_all().unwrap().index_select(&idx, 0).unwrap().reshape((1, H, L, L)).unwrap()
}

fn var(shape: &[usize], seed: u64) -> Var {
    Var::from_tensor(&uniform(shape, -1.0, 1.0, seed).unwrap()).unwrap()
}

/// Output and the gradients of `Σ out·w` with respect to `wrt`.
fn run(q: &Var, k: &Var, v: &Var, opts: &SdpaOptions, wrt: &[&Var]) -> Vec<Vec<f32>> {
    let out = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), opts).unwrap();
    let w = uniform(out.dims(), -1.0, 1.0, 77).unwrap();
    let grads = (&out * &w).unwrap().sum_all().unwrap().backward().unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
    let mut all = vec![flat(&out)];
    all.extend(wrt.iter().map(|x| flat(grads.get(x.as_tensor()).expect("a gradient"))));
    all
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>]) {
    for (n, (x, y)) in a.iter().zip(b).enumerate() {
        let worst = x.iter().zip(y).map(|(p, q)| (p - q).abs() / (1.0 + q.abs())).fold(0.0f32, f32::max);
        assert!(worst < 2e-5, "tensor {n} differs by {worst}");
    }
}

#[test]
fn a_trainable_table_gets_the_gradient_of_its_gathered_bias() {
    let (q, k, v) = (var(&[2, H, L, 8], 1), var(&[2, H, L, 8], 2), var(&[2, H, L, 8], 3));
    let table = var(&[H, 8], 4);
    let modded = SdpaOptions::default().causal(true).score_mod(Arc::new(t5()), Some(table.as_tensor().clone()));
    let biased = SdpaOptions::default().causal(true).bias(gathered(table.as_tensor()));
    let wrt = [&q, &k, &v, &table];
    assert_close(&run(&q, &k, &v, &modded, &wrt), &run(&q, &k, &v, &biased, &wrt));
}

#[test]
fn table_sinks_and_bias_train_together() {
    let (q, k, v) = (var(&[1, H, L, 8], 5), var(&[1, H, L, 8], 6), var(&[1, H, L, 8], 7));
    let (table, sinks, extra) = (var(&[H, 8], 8), var(&[H], 9), var(&[L, L], 10));
    let base = SdpaOptions::default().sinks(sinks.as_tensor().clone());
    let modded =
        base.clone().bias(extra.as_tensor().clone()).score_mod(Arc::new(t5()), Some(table.as_tensor().clone()));
    let summed = (gathered(table.as_tensor()).broadcast_add(extra.as_tensor())).unwrap();
    let biased = base.bias(summed);
    let wrt = [&q, &k, &v, &table, &sinks, &extra];
    assert_close(&run(&q, &k, &v, &modded, &wrt), &run(&q, &k, &v, &biased, &wrt));
}

#[test]
fn a_table_of_the_wrong_length_is_refused() {
    let (q, k, v) = (var(&[1, H, L, 8], 1), var(&[1, H, L, 8], 2), var(&[1, H, L, 8], 3));
    let short = uniform(&[H * 8 - 1], -1.0, 1.0, 4).unwrap();
    let opts = SdpaOptions::default().score_mod(Arc::new(t5()), Some(short));
    let err = sdpa(q.as_tensor(), k.as_tensor(), v.as_tensor(), &opts).unwrap_err().to_string();
    assert!(err.contains("score_table") && err.contains("24") && err.contains("23"), "{err}");
}
