//! The causal backward's fall-back past [`KEPT_STATES_BUDGET`](super::KEPT_STATES_BUDGET) — the
//! segmented path's two passes over each head as one segment — gives the one pass's gradients.

use super::*;
use crate::linear::{linear_attention, FavorFeatures, FeatureMap};
use crate::rng::SplitMix64;

/// `x` as `[b, h, l, d]`.
fn view(x: &[f64], dims: [usize; 4]) -> View4<'_, f64> {
    View4::contiguous("x", x, dims).unwrap()
}

#[test]
fn two_passes_over_whole_heads_give_the_one_pass_gradients() {
    let (b, hq, hkv, l, dd) = (2, 4, 2, 37, 5);
    let mut g = SplitMix64::new(11);
    let mut values = |n: usize| -> Vec<f64> { g.uniform(n, -1.0, 1.0).into_iter().map(f64::from).collect() };
    let (q, k, v, dout) =
        (values(b * hq * l * dd), values(b * hkv * l * dd), values(b * hkv * l * dd), values(b * hq * l * dd));
    let (qs, ks) = ([b, hq, l, dd], [b, hkv, l, dd]);
    let lens = [l, 20];
    for map in [FeatureMap::Elu, FeatureMap::Favor(FavorFeatures::new(dd, 7, 3).unwrap())] {
        let p = LinearParams { causal: true, chunk: 8, segments: 1, key_lens: Some(&lens), ..LinearParams::new(&map) };
        let out = linear_attention(view(&q, qs), view(&k, ks), view(&v, ks), &p).unwrap();
        let inputs = [view(&q, qs), view(&k, ks), view(&v, ks), view(&out, qs), view(&dout, qs)];
        let d = checked(&inputs, &p).unwrap();
        // Garbage in the buffers: every element must be written.
        let grads = || [q.len(), k.len(), v.len()].map(|n| vec![f64::NAN; n]);
        let (mut one, mut two) = (grads(), grads());
        let [dq, dk, dv] = &mut one;
        backward(&d, &p, inputs, GradsMut { dq, dk, dv }).unwrap();
        let [dq, dk, dv] = &mut two;
        segmented::backward(Isa::best(), &d, &p, inputs, &Plan::whole(l, p.chunk), GradsMut { dq, dk, dv }).unwrap();
        for (x, y) in one.iter().zip(&two) {
            let diff = x.iter().zip(y).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(diff < 1e-12, "{map:?}: the two forms differ by {diff}");
        }
    }
}
