use attn_kernels::*;

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn run<T: Real>(
    kernel: Option<Kernel>,
    q: &[T],
    k: &[T],
    v: &[T],
    dout: &[T],
    dims: [usize; 4],
    causal: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let params = AttnParams::<T> {
        mask: MaskSpec { causal, key_lengths: Some(&[4, 5]), ..Default::default() },
        ..Default::default()
    };
    let qv = View4::contiguous("q", q, dims).unwrap();
    let kv = View4::contiguous("k", k, dims).unwrap();
    let vv = View4::contiguous("v", v, dims).unwrap();
    let fwd = reference(&qv, &kv, &vv, &params, false).unwrap();
    let out = View4::contiguous("o", &fwd.out, dims).unwrap();
    let dov = View4::contiguous("do", dout, dims).unwrap();
    let g = reference_backward(&qv, &kv, &vv, &Saved { out, lse: &fwd.lse, dout: dov }, &params, false).unwrap();
    let w = |x: &[T]| x.iter().map(|a| a.to_f64().unwrap()).collect::<Vec<f64>>();
    let _ = kernel;
    (w(&fwd.out), w(&g.dq), w(&g.dk), w(&g.dv))
}

#[test]
fn scratch_bias() {
    let dims = [2, 2, 5, 8];
    let n: usize = dims.iter().product();
    for causal in [true] {
        for seed in 0..6u64 {
            let (q, k, v, d) = (
                rnd(n, 10 * seed + 1).iter().map(|x| x * 4.0).collect::<Vec<_>>(),
                rnd(n, 10 * seed + 2).iter().map(|x| x * 4.0).collect::<Vec<_>>(),
                rnd(n, 10 * seed + 3),
                vec![1.0f32; n],
            );
            let w = |x: &[f32]| x.iter().map(|&a| a as f64).collect::<Vec<f64>>();
            let r64 = run::<f64>(None, &w(&q), &w(&k), &w(&v), &w(&d), dims, causal);
            let n32 = run::<f32>(None, &q, &k, &v, &d, dims, causal);
            let params = AttnParams::<f32> {
                mask: MaskSpec { causal, key_lengths: Some(&[4, 5]), ..Default::default() },
                ..Default::default()
            };
            let qv = View4::contiguous("q", &q, dims).unwrap();
            let kv = View4::contiguous("k", &k, dims).unwrap();
            let vv = View4::contiguous("v", &v, dims).unwrap();
            let fwd = attention_tuned(
                Kernel::Flash(Isa::Avx512),
                Tuning {
                    path: std::env::var("PATH_P").ok().map(|p| if p == "d" { Path::Decode } else { Path::Prefill }),
                    shards: None,
                },
                &qv,
                &KvView::F32(kv),
                &KvView::F32(vv),
                &params,
                false,
            )
            .unwrap();
            let out = View4::contiguous("o", &fwd.out, dims).unwrap();
            let dov = View4::contiguous("do", &d, dims).unwrap();
            let g = attention_backward(
                Kernel::Flash(Isa::Avx512),
                &qv,
                &KvView::F32(kv),
                &KvView::F32(vv),
                &Saved { out, lse: &fwd.lse, dout: dov },
                &params,
                false,
            )
            .unwrap();
            let fast = (w(&fwd.out), w(&g.dq), w(&g.dk), w(&g.dv));
            let stats = |name: &str, x: &[f64], r: &[f64]| {
                let e: Vec<f64> = x.iter().zip(r).map(|(a, b)| a - b).collect();
                let rms = (e.iter().map(|e| e * e).sum::<f64>() / e.len() as f64).sqrt();
                let max = e.iter().fold(0.0f64, |m, e| m.max(e.abs()));
                let scale = e.iter().zip(r).map(|(e, r)| e * r).sum::<f64>() / r.iter().map(|r| r * r).sum::<f64>();
                let mean = e.iter().sum::<f64>() / e.len() as f64;
                // coherent sum over rows of each column (like a weight gradient with x = 1)
                println!("  {name}: rms {rms:.2e} max {max:.2e} mean {mean:.2e} rel-scale {scale:.2e}");
            };
            {
                let params64 = AttnParams::<f64> {
                    mask: MaskSpec { causal, key_lengths: Some(&[4, 5]), ..Default::default() },
                    ..Default::default()
                };
                let (q6, k6, v6) = (w(&q), w(&k), w(&v));
                let f64o = reference(
                    &View4::contiguous("q", &q6, dims).unwrap(),
                    &View4::contiguous("k", &k6, dims).unwrap(),
                    &View4::contiguous("v", &v6, dims).unwrap(),
                    &params64,
                    false,
                )
                .unwrap();
                let n32o = reference(&qv, &kv, &vv, &params, false).unwrap();
                let le = |x: &[f32]| x.iter().zip(&f64o.lse).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0f64, f64::max);
                println!(
                    "lse err fast {:.2e} naive {:.2e}; lse range {:?}",
                    le(&fwd.lse),
                    le(&n32o.lse),
                    f64o.lse.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)))
                );
            }
            let psum = |x: &[f64]| (x.iter().sum::<f64>() - (dims[0] * dims[1] * dims[2] * dims[3]) as f64).abs();
            println!("P sums: fast {:.2e} naive {:.2e} f64 {:.2e}", psum(&fast.3), psum(&n32.3), psum(&r64.3));
            println!("causal {causal}");
            for (nm, f, nv, r) in [
                ("out", &fast.0, &n32.0, &r64.0),
                ("dq", &fast.1, &n32.1, &r64.1),
                ("dk", &fast.2, &n32.2, &r64.2),
                ("dv", &fast.3, &n32.3, &r64.3),
            ] {
                stats(&format!("{nm} fast "), f, r);
                stats(&format!("{nm} naive"), nv, r);
            }
        }
    }
}
