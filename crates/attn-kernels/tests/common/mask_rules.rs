//! An independent statement of the mask and dropout rules, written from the documented semantics
//! (not from the crate's `mask.rs`): which keys a query may attend, the structure those rules
//! impose on a result, the keys no query reads, and which weights dropout keeps.

use attn_kernels::{Align, AttnOutput};

use super::case::Case;

impl Case {
    /// Whether query `(b, h, i)` may attend key `j`, stated from the documented rules: causal
    /// `j <= c`, window `c - left <= j <= c + right` with `c = i` (top-left) or `i + Lk - Lq`
    /// (bottom-right), `j < key_lengths[b]`, keep-mask true, bias not −∞, the block mask's
    /// predicate true.
    pub fn allowed(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let d = self.dims;
        let c = i as i64 + if self.align == Align::BottomRight { d.lk as i64 - d.lq as i64 } else { 0 };
        let j64 = j as i64;
        let window = self.window.unwrap_or_default();
        let outside = (self.causal && j64 > c)
            || window.left.is_some_and(|l| j64 < c - l as i64)
            || window.right.is_some_and(|r| j64 > c + r as i64)
            || self.key_lengths.as_ref().is_some_and(|kl| j >= kl[b])
            || self.keep.as_ref().is_some_and(|m| !m.at([b, h, i, j]))
            || self.bias.as_ref().is_some_and(|m| m.at([b, h, i, j]) == f32::NEG_INFINITY)
            || self.sparse.as_ref().is_some_and(|s| !s.keep.keep(b, h, i, j));
        !outside
    }

    /// Whether query `(b, h, i)` may attend any key.
    pub fn any_allowed(&self, b: usize, h: usize, i: usize) -> bool {
        (0..self.dims.lk).any(|j| self.allowed(b, h, i, j))
    }

    /// Checks the structure the mask rules impose on a run with weights of finite inputs: a row
    /// with no allowed key has out exactly 0, weights 0 and lse −∞ (its head's sink, exactly, when
    /// the case has one); any other row has finite out and lse, non-negative weights exactly 0 at
    /// masked keys and summing to 1 (to `1 − exp(sink − lse)` with a sink). Returns the number of
    /// fully masked rows.
    pub fn assert_structure(&self, label: &str, res: &AttnOutput<f32>) -> usize {
        let d = self.dims;
        let w = res.weights.as_ref().expect("a run with weights");
        let mut masked_rows = 0;
        for (b, h, i) in self.rows() {
            let r = self.row(b, h, i);
            let out = &res.out[r * d.dv..(r + 1) * d.dv];
            let wr = &w[r * d.lk..(r + 1) * d.lk];
            let sink = self.sinks.as_ref().map_or(f32::NEG_INFINITY, |s| s[h]);
            if !self.any_allowed(b, h, i) {
                masked_rows += 1;
                assert!(out.iter().all(|&x| x == 0.0), "{label}: fully masked row ({b},{h},{i}) out {out:?}");
                assert_eq!(res.lse[r], sink, "{label}: fully masked row ({b},{h},{i}) lse");
                assert!(wr.iter().all(|&x| x == 0.0), "{label}: fully masked row ({b},{h},{i}) weights {wr:?}");
                continue;
            }
            assert!(out.iter().all(|x| x.is_finite()), "{label}: row ({b},{h},{i}) out {out:?}");
            assert!(res.lse[r].is_finite(), "{label}: row ({b},{h},{i}) lse {}", res.lse[r]);
            for (j, &x) in wr.iter().enumerate() {
                assert!(x >= 0.0, "{label}: weight ({b},{h},{i},{j}) = {x}");
                assert!(self.allowed(b, h, i, j) || x == 0.0, "{label}: masked weight ({b},{h},{i},{j}) = {x}");
            }
            let sum: f64 = wr.iter().map(|&x| x as f64).sum();
            let want = 1.0 - (sink as f64 - res.lse[r] as f64).exp();
            let tol = 1e-5 + 2.0 * d.lk as f64 * f32::EPSILON as f64;
            assert!((sum - want).abs() <= tol, "{label}: row ({b},{h},{i}) weights sum to {sum}, expected {want}");
        }
        masked_rows
    }

    /// Whether dropout keeps weight `(b, h, i, j)`, from the library's counter-based draw.
    pub fn kept(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let d = self.dims;
        let dr = self.dropout.expect("a case with dropout");
        dr.keeps(dr.row_key(b, h, i, [d.hq, d.lq]), j)
    }

    /// The keys `(b, g, j)` that no query of any head reading KV head `g` may attend.
    pub fn keys_masked_everywhere(&self) -> Vec<(usize, usize, usize)> {
        let d = self.dims;
        let group = d.hq / d.hkv;
        let mut keys = Vec::new();
        for b in 0..d.b {
            for g in 0..d.hkv {
                for j in 0..d.lk {
                    let read = (g * group..(g + 1) * group).any(|h| (0..d.lq).any(|i| self.allowed(b, h, i, j)));
                    if !read {
                        keys.push((b, g, j));
                    }
                }
            }
        }
        keys
    }
}
