//! The backward after either forward path: the decode and prefill paths round a score
//! differently (a reduction across `Dk` against a chain of multiply-adds), and the backward
//! rebuilds `P = exp(S − lse)` from the forward's log-sum-exp. Scored the other path's way, every
//! probability of a row is off by about one ulp of `|S|` relative (several ulp of `P` when
//! scores are large), which random tests with small scores do not show; summed over rows it
//! doubled to quadrupled `dV`'s error and failed the `seq2seq` module's PyTorch parity. The
//! backward learns the forward's path from what the forward saved (`AttnOutput::path`, handed on
//! by `Saved::of`), so a forward forced onto either path is followed.

use attn_kernels::{BackwardTuning, Kernel, Path, Tuning};

use super::harness::{grads64, grads_tuned, random_dout};
use crate::common::{dims, Case};

/// Root mean square of `x − r`.
fn rms(x: &[f32], r: &[f64]) -> f64 {
    (x.iter().zip(r).map(|(&x, &r)| (x as f64 - r).powi(2)).sum::<f64>() / r.len().max(1) as f64).sqrt()
}

/// On decode-sized calls (a few query rows, causal, key lengths) with large scores, forcing
/// each forward path in turn, the gradients' RMS errors, pooled over several inputs, stay within
/// 1.5 times the naive `f32` backward's (measured 0.3–1.05 on every ISA; 2.3–2.8 for `dV` when
/// the backward scored the other path's way).
pub fn check_forward_path_consistency(kernel: Kernel) {
    for path in [Path::Decode, Path::Prefill] {
        let tuning = (Tuning { path: Some(path), shards: None, ..Tuning::DEFAULT }, BackwardTuning::default());
        let mut sums = [[0.0f64; 2]; 3];
        for seed in 0..8 {
            let d = dims(2, 2, 1, 5, 7, 8, 8);
            let case =
                Case { causal: true, key_lengths: Some(vec![4, 7]), scale: Some(4.0), ..Case::new(d, 500 + seed) };
            let dout = random_dout(&case, seed);
            let g64 = grads64(&case, &dout);
            let fast = grads_tuned(&case, kernel, tuning, &dout).unwrap();
            let naive = grads_tuned(&case, Kernel::Reference, tuning, &dout).unwrap();
            for (x, (f, n, r)) in
                [(&fast.dq, &naive.dq, &g64.dq), (&fast.dk, &naive.dk, &g64.dk), (&fast.dv, &naive.dv, &g64.dv)]
                    .into_iter()
                    .enumerate()
            {
                sums[x][0] += rms(f, r).powi(2);
                sums[x][1] += rms(n, r).powi(2);
            }
        }
        for (name, [f, n]) in ["dq", "dk", "dv"].into_iter().zip(sums) {
            let ratio = (f / n).sqrt();
            assert!(
                ratio <= 1.5,
                "{}, {path:?} forward: {name} RMS error {ratio:.2}x the naive backward's",
                kernel.name()
            );
        }
    }
}
