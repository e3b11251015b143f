//! One benchmark case's sizes, parsed from `--shape B,H,Lq,D` plus the shared `--kv-len`,
//! `--kv-heads` and `--dv` options, and its floating-point operation count.

use anyhow::{bail, Context};
use attn::sparse::SPARSE_BLOCK;
use attn::SdpaOptions;
use attn_kernels::mask::Band;
use attn_kernels::Dims;

/// How FLOPs are counted, shown in `attn bench --help`.
pub const FLOP_RULE: &str = "FLOP count: for every (batch, query head), 2·Dk + 2·Dv per unmasked (query i, key j) \
pair (the q·k dot product and the weighted sum of v, one multiply and one add each); softmax, scaling and \
masking are not counted. Causal and window bands are counted exactly (causal, top-left: query i sees \
min(i+1, Lk) keys), so full attention is 4·B·H·Lq·Lk·D when Dk = Dv = D and causal is about half of it. \
With --pattern the pairs are those the pattern allows as well, counted exactly (every pair of its \
partial blocks tested), not its listed blocks times 64·64. With --backward a call \
is the forward plus its backward, counted as 3.5 times the forward's FLOPs (the backward as 2.5 times, \
FlashAttention's convention: five matrix products of the forward's size against its two).";

/// Parses `B,H,Lq,D` into `[B, H, Lq, D]`; every size must be at least 1.
pub fn parse_shape(text: &str) -> anyhow::Result<[usize; 4]> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    if fields.len() != 4 {
        bail!("--shape '{text}': expected 4 comma-separated sizes B,H,Lq,D, found {} field(s)", fields.len());
    }
    let mut shape = [0usize; 4];
    for ((slot, field), name) in shape.iter_mut().zip(&fields).zip(["B", "H", "Lq", "D"]) {
        *slot = field
            .parse()
            .ok()
            .filter(|&n: &usize| n >= 1)
            .with_context(|| format!("--shape '{text}': {name} is '{field}', expected an integer >= 1"))?;
    }
    Ok(shape)
}

/// The sizes of a case: `q: [B, H, Lq, D]`, `k: [B, Hkv, Lk, D]`, `v: [B, Hkv, Lk, Dv]`, with
/// `Lk` (default `Lq`), `Hkv` (default `H`) and `Dv` (default `D`) from the options.
pub fn case_dims(
    shape: [usize; 4],
    kv_len: Option<usize>,
    kv_heads: Option<usize>,
    dv: Option<usize>,
) -> anyhow::Result<Dims> {
    let [b, hq, lq, dk] = shape;
    let at_least_one = |flag: &str, v: Option<usize>, default: usize| match v {
        Some(0) => bail!("{flag} is 0, expected an integer >= 1"),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let lk = at_least_one("--kv-len", kv_len, lq)?;
    let hkv = at_least_one("--kv-heads", kv_heads, hq)?;
    let dv = at_least_one("--dv", dv, dk)?;
    if hq % hkv != 0 {
        bail!("--kv-heads {hkv}: the {hq} query heads of --shape must be a multiple of it");
    }
    Ok(Dims { b, hq, hkv, lq, lk, dk, dv })
}

/// FLOPs of one call by [`FLOP_RULE`]: `2·(Dk + Dv)` per unmasked `(i, j)` pair per batch and
/// query head, the pairs taken from the kernels' own band for the options' causal mask, window and
/// alignment, and from the block mask when there is one.
pub fn flops(dims: &Dims, opts: &SdpaOptions) -> u64 {
    let band = Band::new(opts.causal, opts.window, opts.align, dims.lq, dims.lk);
    let [pairs] = per_head(dims, opts, |b, h| {
        [(0..dims.lq)
            .map(|i| {
                let (lo, hi) = band.keys(i, dims.lk);
                match &opts.block_mask {
                    Some(m) => m.allowed(b, h, i, lo..hi) as u64,
                    None => (hi - lo) as u64,
                }
            })
            .sum()]
    });
    pairs * 2 * (dims.dk + dims.dv) as u64
}

/// The `64 × 64` blocks of `[Lq, Lk]` ([`SPARSE_BLOCK`]) a call computes, as fractions of all its
/// blocks over every batch entry and query head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Blocks {
    /// Those that meet the band of the options' causal mask and window and, with a block mask,
    /// that it lists.
    pub computed: f64,
    /// Those of them the block mask lists as partial: its predicate is evaluated on their pairs.
    pub partial: f64,
}

/// The blocks a call under `opts` computes (see [`Blocks`]).
pub fn blocks(dims: &Dims, opts: &SdpaOptions) -> Blocks {
    let band = Band::new(opts.causal, opts.window, opts.align, dims.lq, dims.lk);
    let (nq, nk) = (dims.lq.div_ceil(SPARSE_BLOCK), dims.lk.div_ceil(SPARSE_BLOCK));
    let [computed, partial] = per_head(dims, opts, |b, h| {
        let mut counts = [0, 0];
        for qb in 0..nq {
            // The band's key range only moves right from row to row: the block's rows meet
            // the keys from the first row's start to the last row's end.
            let (lo, _) = band.keys(qb * SPARSE_BLOCK, dims.lk);
            let (_, hi) = band.keys(((qb + 1) * SPARSE_BLOCK).min(dims.lq) - 1, dims.lk);
            let meets = |kb: usize| kb * SPARSE_BLOCK < hi && (kb + 1) * SPARSE_BLOCK > lo;
            match &opts.block_mask {
                Some(m) => {
                    let (listed, full) = m.kv_blocks(b, h, qb);
                    for (_, &f) in listed.iter().zip(full).filter(|(&kb, _)| meets(kb as usize)) {
                        counts[0] += 1;
                        counts[1] += u64::from(!f);
                    }
                }
                None => counts[0] += (0..nk).filter(|&kb| meets(kb)).count() as u64,
            }
        }
        counts
    });
    let all = (nq * nk * dims.b * dims.hq).max(1) as f64;
    Blocks { computed: computed as f64 / all, partial: partial as f64 / all }
}

/// `count(b, h)` summed over every batch entry and query head of `dims`, element by element,
/// calling it once per `(b, h)` the block mask tells apart (once in all without a mask, or with
/// one that broadcasts).
fn per_head<const N: usize>(dims: &Dims, opts: &SdpaOptions, count: impl Fn(usize, usize) -> [u64; N]) -> [u64; N] {
    let (mb, mh) = opts.block_mask.as_ref().map_or((1, 1), |m| (m.shape().batch, m.shape().heads));
    let copies = (dims.b / mb * (dims.hq / mh)) as u64;
    let mut sum = [0; N];
    for (b, h) in (0..mb).flat_map(|b| (0..mh).map(move |h| (b, h))) {
        for (s, c) in sum.iter_mut().zip(count(b, h)) {
            *s += c * copies;
        }
    }
    sum
}

/// FLOPs of a forward plus its backward by [`FLOP_RULE`]: 3.5 times the forward's `forward`
/// (always even, so exact).
pub fn with_backward(forward: u64) -> u64 {
    forward / 2 * 7
}

/// `B,H,Lq,D` as given to `--shape`.
pub fn shape_text(dims: &Dims) -> String {
    format!("{},{},{},{}", dims.b, dims.hq, dims.lq, dims.dk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_shape_and_rejects_bad_ones() {
        assert_eq!(parse_shape("2, 8,128,64").unwrap(), [2, 8, 128, 64]);
        for bad in ["1,2,3", "1,2,3,4,5", "1,2,x,4", "1,0,3,4", "", "1,2,-3,4"] {
            let e = parse_shape(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--shape '{bad}'")), "{e}");
        }
    }

    #[test]
    fn full_attention_is_four_bhld() {
        let d = case_dims([2, 3, 5, 8], None, None, None).unwrap();
        assert_eq!(flops(&d, &SdpaOptions::default()), 4 * 2 * 3 * 5 * 5 * 8);
    }

    #[test]
    fn causal_counts_the_lower_triangle_top_left() {
        // Lq = 4, Lk = 6: rows see 1, 2, 3, 4 keys; Lq = 6, Lk = 3: rows see 1, 2, 3, 3, 3, 3.
        let causal = SdpaOptions::default().causal(true);
        let d = case_dims([1, 1, 4, 2], Some(6), None, Some(3)).unwrap();
        assert_eq!(flops(&d, &causal), 10 * 2 * (2 + 3));
        let d = case_dims([1, 2, 6, 4], Some(3), Some(1), None).unwrap();
        assert_eq!(flops(&d, &causal), 15 * 16 * 2);
    }

    #[test]
    fn window_and_alignment_count_their_band() {
        // Lq = Lk = 5, window (1, 0): rows see 1, 2, 2, 2, 2 keys.
        let d = case_dims([1, 1, 5, 2], None, None, None).unwrap();
        assert_eq!(flops(&d, &SdpaOptions::default().window(Some(1), Some(0))), 9 * 2 * (2 + 2));
        // Lq = 2, Lk = 4, causal bottom-right: rows see 3 and 4 keys.
        let d = case_dims([1, 1, 2, 2], Some(4), None, None).unwrap();
        let opts = SdpaOptions::default().causal(true).align(attn::Align::BottomRight);
        assert_eq!(flops(&d, &opts), 7 * 2 * (2 + 2));
    }

    #[test]
    fn a_block_mask_counts_its_allowed_pairs_inside_the_band_per_head() {
        // Lq = 130, Lk = 200 (three and four blocks), strided stride 5, with a window (70, 0) on
        // top; 2 batch entries, 3 heads; Dk = 4, Dv = 2.
        let mask = attn::sparse::Pattern::Strided { stride: 5 }.block_mask(130, 200).unwrap();
        let opts = SdpaOptions::default().window(Some(70), Some(0)).block_mask(std::sync::Arc::new(mask.clone()));
        let d = case_dims([2, 3, 130, 4], Some(200), None, Some(2)).unwrap();
        let pairs = (0..130).flat_map(|i| (0..200).map(move |j| (i, j)));
        let allowed = pairs.filter(|&(i, j)| j <= i && j + 70 >= i && mask.allows(0, 0, i, j)).count() as u64;
        assert_eq!(flops(&d, &opts), allowed * 2 * 6 * 6);
        // Blocks meeting the band that the mask lists, out of 3·4: query block 0 meets key block
        // 0, block 1 (rows 64..128) keys 0..128, block 2 (rows 128, 129) keys 58..130.
        // Every one is partial: stride 5 puts a stride column in every block below the diagonal.
        assert_eq!(blocks(&d, &opts), Blocks { computed: 6.0 / 12.0, partial: 6.0 / 12.0 });
        let narrow = SdpaOptions { window: Some(attn::Window { left: Some(10), right: Some(0) }), ..opts };
        assert_eq!(blocks(&d, &narrow).computed, 5.0 / 12.0);
        assert_eq!(blocks(&d, &SdpaOptions::default()), Blocks { computed: 1.0, partial: 0.0 });
        // Document blocks: the diagonal ones partial (causal inside), the one below full.
        let docs = attn::sparse::Pattern::Document { lengths: vec![200] }.block_mask(200, 200).unwrap();
        let d = case_dims([1, 1, 200, 4], None, None, None).unwrap();
        let b = blocks(&d, &SdpaOptions::default().block_mask(std::sync::Arc::new(docs)));
        assert_eq!(b, Blocks { computed: 10.0 / 16.0, partial: 4.0 / 16.0 });
    }

    #[test]
    fn kv_options_are_checked() {
        assert!(case_dims([1, 6, 4, 4], None, Some(4), None).unwrap_err().to_string().contains("multiple"));
        assert!(case_dims([1, 6, 4, 4], Some(0), None, None).is_err());
        assert_eq!(case_dims([1, 6, 4, 4], None, Some(3), Some(2)).unwrap().group(), 2);
    }
}
