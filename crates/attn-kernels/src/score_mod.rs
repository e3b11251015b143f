//! Programmable score modifications (FlexAttention's `score_mod`): a function `f(s, b, h, q, kv)`
//! of each scaled score `s = scale·q·k`, applied before the soft-cap, the bias and the masks, that
//! may read a trainable table (a relative-position bias `[H, buckets]`, say) and supplies its
//! derivatives with respect to the score and to the table entry it reads, so the backward chains
//! through it and returns the table's gradient ([`AttnGrads::dtable`](crate::AttnGrads)).
//!
//! Implement the `f64` scalars [`score`](ScoreMod::score) and [`dscore`](ScoreMod::dscore) (and
//! [`dtable`](ScoreMod::dtable) when it reads a table): the reference kernel calls them per element
//! in its own precision. The flash kernels call the row methods, one call per row of a tile, whose
//! defaults loop over the scalars inside the implementation (no dynamic dispatch per element);
//! override them for speed. Built-ins: [`Softcap`], [`Alibi`], [`RelativeBias`] (T5's buckets).
use crate::simd::{on_isa, Isa};

/// A score modification; see the module header.
pub trait ScoreMod: Send + Sync {
    /// Entries of the trainable table it reads (0: none).
    fn table_len(&self) -> usize {
        0
    }

    /// `f(s)` for query `q` and key `kv` of `(b, h)`, reading `table`.
    fn score(&self, s: f64, table: &[f32], b: usize, h: usize, q: usize, kv: usize) -> f64;

    /// `∂f/∂s` at `s`.
    fn dscore(&self, s: f64, table: &[f32], b: usize, h: usize, q: usize, kv: usize) -> f64;

    /// The table entry `f` reads at `(b, h, q, kv)` and `∂f/∂table[entry]` at `s`; `None` when it
    /// reads none.
    fn dtable(&self, _s: f64, _table: &[f32], _b: usize, _h: usize, _q: usize, _kv: usize) -> Option<(usize, f64)> {
        None
    }

    /// `s[c] ← f(s[c])` for key `kv0 + c` of row `[b, h, q]`, and with `d`, `d[c] ← ∂f/∂s` at the
    /// score given.
    fn score_row(&self, table: &[f32], [b, h, q]: [usize; 3], kv0: usize, s: &mut [f32], d: Option<&mut [f32]>) {
        if let Some(d) = d {
            for (c, (x, dx)) in s.iter_mut().zip(d.iter_mut()).enumerate() {
                *dx = self.dscore(*x as f64, table, b, h, q, kv0 + c) as f32;
            }
        }
        for (c, x) in s.iter_mut().enumerate() {
            *x = self.score(*x as f64, table, b, h, q, kv0 + c) as f32;
        }
    }

    /// `dt[entry] += g[c] · ∂f/∂table[entry]` for key `kv0 + c` of row `[b, h, q]` with unmodified
    /// score `s[c]`, wherever `g[c] ≠ 0` (`g` the gradient of the modified score).
    fn dtable_row(&self, table: &[f32], [b, h, q]: [usize; 3], kv0: usize, s: &[f32], g: &[f32], dt: &mut [f32]) {
        for (c, (&x, &gc)) in s.iter().zip(g).enumerate() {
            if gc != 0.0 {
                if let Some((e, dv)) = self.dtable(x as f64, table, b, h, q, kv0 + c) {
                    dt[e] += (gc as f64 * dv) as f32;
                }
            }
        }
    }
}

/// A modification with the table it reads, as a call takes it.
#[derive(Clone, Copy)]
pub struct ScoreFn<'a> {
    /// The modification.
    pub m: &'a dyn ScoreMod,
    /// Its table, `m.table_len()` entries (empty when it reads none).
    pub table: &'a [f32],
}

impl std::fmt::Debug for ScoreFn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScoreFn(table of {})", self.table.len())
    }
}

/// Soft-capping `cap·tanh(s/cap)`, the built-in `softcap` as a modification.
#[derive(Debug, Clone, Copy)]
pub struct Softcap(pub f64);

impl ScoreMod for Softcap {
    fn score(&self, s: f64, _t: &[f32], _b: usize, _h: usize, _q: usize, _kv: usize) -> f64 {
        self.0 * (s / self.0).tanh()
    }
    fn dscore(&self, s: f64, _t: &[f32], _b: usize, _h: usize, _q: usize, _kv: usize) -> f64 {
        let t = (s / self.0).tanh();
        1.0 - t * t
    }
    fn score_row(&self, _t: &[f32], _row: [usize; 3], _kv0: usize, s: &mut [f32], d: Option<&mut [f32]>) {
        crate::softcap::softcap_any(s, self.0 as f32, d);
    }
}

/// ALiBi (Press et al. 2022): `s − m_h · |i' − kv|` with one slope `m_h` per query head and `i'`
/// query `i`'s position on the key axis (`i` top-left, `i + Lk − Lq` bottom-right); with causal
/// masking only `kv ≤ i'` remain, the paper's `−m_h · (i' − kv)`.
#[derive(Debug, Clone)]
pub struct Alibi {
    /// Slopes per query head.
    pub slopes: Vec<f64>,
    /// `i' − i`.
    pub offset: isize,
}

impl Alibi {
    /// The paper's slopes for `heads` heads aligned by `align` for `lq` queries over `lk` keys.
    pub fn new(heads: usize, lq: usize, lk: usize, align: crate::Align) -> Self {
        let offset = match align {
            crate::Align::TopLeft => 0,
            crate::Align::BottomRight => lk as isize - lq as isize,
        };
        Self { slopes: Self::slopes(heads), offset }
    }

    /// The slopes of `heads` heads: `2^(−8h/n)` for `h = 1..n` when `n` is a power of two; for
    /// other `n`, the slopes of the power of two below it followed by every other slope of the
    /// power of two above it (the paper's reference code).
    pub fn slopes(heads: usize) -> Vec<f64> {
        let pow2 = |n: usize| -> Vec<f64> { (1..=n).map(|h| 2f64.powf(-8.0 * h as f64 / n as f64)).collect() };
        if heads == 0 {
            return Vec::new();
        }
        let below = 1usize << (usize::BITS - 1 - heads.leading_zeros());
        let mut slopes = pow2(below);
        slopes.extend(pow2(2 * below).into_iter().step_by(2).take(heads - below));
        slopes
    }

    fn distance(&self, q: usize, kv: usize) -> f64 {
        (q as f64 + self.offset as f64 - kv as f64).abs()
    }
}

impl ScoreMod for Alibi {
    fn score(&self, s: f64, _t: &[f32], _b: usize, h: usize, q: usize, kv: usize) -> f64 {
        s - self.slopes[h] * self.distance(q, kv)
    }
    fn dscore(&self, _s: f64, _t: &[f32], _b: usize, _h: usize, _q: usize, _kv: usize) -> f64 {
        1.0
    }
    fn score_row(&self, _t: &[f32], [_, h, q]: [usize; 3], kv0: usize, s: &mut [f32], d: Option<&mut [f32]>) {
        // Column `c` lies `|base − c|` from the row's diagonal.
        let base = q as i64 + self.offset as i64 - kv0 as i64;
        add_distance_bias(-self.slopes[h], base, s);
        if let Some(d) = d {
            d.fill(1.0);
        }
    }
}

/// `s[c] += slope·|base − c|`, the product taken in `f64` and rounded to `f32` as [`Alibi::score`]
/// rounds it (bit for bit), in vectors of this CPU's widest instruction set: a modification is
/// called through `dyn ScoreMod`, so its own code is compiled for baseline x86-64, whose scalar
/// `u64 → f64` conversions cost more per element than the tile's whole dot product (see
/// docs/performance-log.md, "attn-kernels/src/score_mod.rs: add_distance_bias").
fn add_distance_bias(slope: f64, base: i64, s: &mut [f32]) {
    let fits = |x: i64| i32::try_from(x).is_ok();
    if !(fits(base) && fits(base - s.len() as i64)) {
        for (c, x) in s.iter_mut().enumerate() {
            *x += (slope * (base - c as i64).unsigned_abs() as f64) as f32;
        }
        return;
    }
    let base = base as i32;
    on_isa(Isa::best(), || distance_bias(slope, base, s))
}

/// [`add_distance_bias`] where every `base − c` fits in `i32` (so the loop vectorises).
#[inline(always)]
fn distance_bias(slope: f64, base: i32, s: &mut [f32]) {
    for (c, x) in s.iter_mut().enumerate() {
        *x += (slope * f64::from((base - c as i32).unsigned_abs())) as f32;
    }
}

/// T5's relative-position bias (Raffel et al. 2020): `s + table[h, bucket(kv − q)]` with a trainable
/// table `[heads, buckets]` and T5's logarithmic buckets (exact up to `buckets/2` positions, or a
/// quarter when `bidirectional`, then log-spaced up to `max_distance`), computed as PyTorch /
/// Hugging Face compute them.
#[derive(Debug, Clone, Copy)]
pub struct RelativeBias {
    /// Query heads (the table's rows).
    pub heads: usize,
    /// Buckets per head.
    pub buckets: usize,
    /// Distance beyond which every position shares the last bucket.
    pub max_distance: usize,
    /// Whether later keys get buckets of their own (encoder) or share bucket 0 (decoder).
    pub bidirectional: bool,
}

impl RelativeBias {
    /// The bucket of relative position `kv − q`.
    pub fn bucket(&self, rel: isize) -> usize {
        let (mut n, mut base) = (self.buckets, 0);
        let dist = if self.bidirectional {
            n /= 2;
            if rel > 0 {
                base = n;
            }
            rel.unsigned_abs()
        } else {
            (-rel.min(0)) as usize
        };
        let exact = n / 2;
        if dist < exact {
            return base + dist;
        }
        // In `f32`, as `torch.log(relative_position.float() / max_exact)` computes it.
        let log = (dist as f32 / exact as f32).ln() / ((self.max_distance as f64 / exact as f64).ln() as f32);
        let large = exact + (log * (n - exact) as f32) as usize;
        base + large.min(n - 1)
    }
    fn entry(&self, h: usize, q: usize, kv: usize) -> usize {
        h * self.buckets + self.bucket(kv as isize - q as isize)
    }
}

impl ScoreMod for RelativeBias {
    fn table_len(&self) -> usize {
        self.heads * self.buckets
    }
    fn score(&self, s: f64, t: &[f32], _b: usize, h: usize, q: usize, kv: usize) -> f64 {
        s + t[self.entry(h, q, kv)] as f64
    }
    fn dscore(&self, _s: f64, _t: &[f32], _b: usize, _h: usize, _q: usize, _kv: usize) -> f64 {
        1.0
    }
    fn dtable(&self, _s: f64, _t: &[f32], _b: usize, h: usize, q: usize, kv: usize) -> Option<(usize, f64)> {
        Some((self.entry(h, q, kv), 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ALiBi's rows against its per-element formula, bit for bit, on the vector path and on the
    /// wide-offset fallback.
    #[test]
    fn alibi_rows_round_as_the_per_element_formula() {
        let wide = Alibi { slopes: vec![0.25, 0.5], offset: 1 << 40 };
        for a in [Alibi::new(8, 40, 300, crate::Align::BottomRight), Alibi::new(3, 64, 64, crate::Align::TopLeft), wide]
        {
            for h in [0, a.slopes.len() - 1] {
                for (q, kv0) in [(0, 0), (17, 5), (39, 260), (63, 0)] {
                    let mut row: Vec<f32> = (0..37).map(|c| c as f32 * 0.37 - 3.0).collect();
                    let want: Vec<f32> = row
                        .iter()
                        .enumerate()
                        .map(|(c, &x)| x + (-a.slopes[h] * a.distance(q, kv0 + c)) as f32)
                        .collect();
                    let mut d = vec![0.0; row.len()];
                    a.score_row(&[], [0, h, q], kv0, &mut row, Some(&mut d));
                    assert_eq!(row, want, "head {h}, query {q}, keys from {kv0}, offset {}", a.offset);
                    assert!(d.iter().all(|&x| x == 1.0));
                }
            }
        }
    }
}
