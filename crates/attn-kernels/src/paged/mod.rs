//! Attention over a paged KV cache, as serving stacks keep it (vLLM's PagedAttention,
//! FlashAttention's `block_table`): keys and values in pages `[num_pages, page_size, Hkv, D]`,
//! each sequence's positions listed page by page in its row of a block table, stored as f32,
//! f16, bf16 or quantized ([`Pages`]: q8_0 blocks, fp8 e4m3 with a per-head scale), the
//! quantized ones dequantized a chunk of keys at a time inside the kernel, never into a copy of
//! the cache.
//!
//! One call ([`paged_attention`]) attends `Lq` new queries per sequence, decode (`Lq = 1`) and
//! chunked prefill alike, each sequence against its own length (continuous batching), with
//! FlashAttention's `flash_attn_with_kvcache` semantics: the queries are the last `Lq` positions
//! of their sequence (causal and windows aligned bottom-right), soft-capping, sinks and grouped
//! heads as in [`crate::AttnParams`], the log-sum-exp out. A long sequence's keys are spread over
//! the threads in shards merged by their log-sum-exps (split-KV). The kernel is
//! `crate::flash::paged`; [`PagedKv::gather`] gives the dense, dequantized cache of one sequence
//! for the oracle.
//!
//! - [`quant`]: the q8_0 and e4m3 formats, encode and decode.
//! - [`cascade`]: cascade attention, a prefix shared by many sequences attended in one pass.

pub mod cascade;
pub mod quant;

use half::{bf16, f16};

use crate::error::{AttnError, Result};
use crate::mask::Window;
use crate::view::View4;
pub use cascade::cascade_attention;
pub use quant::{fp8_decode, fp8_encode, q8_decode, q8_encode, FP8_MAX, Q8_BLOCK};

/// The storage of one of a paged cache's tensors, `[num_pages, page_size, Hkv, D]` row-major.
#[derive(Debug, Clone, Copy)]
pub enum Pages<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 values.
    F16(&'a [f16]),
    /// bfloat16 values.
    Bf16(&'a [bf16]),
    /// llama.cpp's q8_0: `values` as the tensor's elements, `scales: [num_pages, page_size, Hkv,
    /// D / 32]`, element `x = values[i] · scales[i / 32]` (`D` a multiple of [`Q8_BLOCK`]).
    Q8 {
        /// Signed bytes, one per element.
        values: &'a [i8],
        /// One scale per block of 32 elements along `D`.
        scales: &'a [f16],
    },
    /// fp8 e4m3 codes (`E4M3FN`) times one scale per key/value head, `scales: [Hkv]`.
    Fp8 {
        /// e4m3 bits, one per element.
        values: &'a [u8],
        /// Positive, finite scale per head.
        scales: &'a [f32],
    },
}

impl Pages<'_> {
    /// Elements held (of `values` for the quantized kinds).
    fn len(&self) -> usize {
        match self {
            Pages::F32(x) => x.len(),
            Pages::F16(x) => x.len(),
            Pages::Bf16(x) => x.len(),
            Pages::Q8 { values, .. } => values.len(),
            Pages::Fp8 { values, .. } => values.len(),
        }
    }

    /// Asks for rows `rows` (of `d` elements, as [`Pages::widen_row`] numbers them) in the L2 cache.
    #[inline(always)]
    pub(crate) fn prefetch(&self, rows: std::ops::Range<usize>, d: usize) {
        use crate::prefetch::{lines, L2};
        let span = rows.start * d..rows.end * d;
        match self {
            Pages::F32(x) => lines::<L2, _>(&x[span]),
            Pages::F16(x) => lines::<L2, _>(&x[span]),
            Pages::Bf16(x) => lines::<L2, _>(&x[span]),
            Pages::Q8 { values, scales } => {
                lines::<L2, _>(&scales[span.start / Q8_BLOCK..span.end / Q8_BLOCK]);
                lines::<L2, _>(&values[span]);
            }
            Pages::Fp8 { values, .. } => lines::<L2, _>(&values[span]),
        }
    }

    /// Row `r` (`r = (page · page_size + slot) · Hkv + head`, of `d` elements) widened into `out`,
    /// element by element: the definition the kernel's vector decoding matches.
    #[inline(always)]
    pub(crate) fn widen_row(&self, r: usize, heads: usize, d: usize, out: &mut [f32]) {
        let span = r * d..(r + 1) * d;
        match self {
            Pages::F32(x) => out.copy_from_slice(&x[span]),
            Pages::F16(x) => out.iter_mut().zip(&x[span]).for_each(|(o, v)| *o = v.to_f32()),
            Pages::Bf16(x) => out.iter_mut().zip(&x[span]).for_each(|(o, v)| *o = v.to_f32()),
            Pages::Q8 { values, scales } => {
                let nb = d / Q8_BLOCK;
                q8_decode(&values[span], &scales[r * nb..(r + 1) * nb], out);
            }
            Pages::Fp8 { values, scales } => quant::fp8_decode_row(&values[span], scales[r % heads], out),
        }
    }

    /// The storage's name in messages.
    fn kind(&self) -> &'static str {
        match self {
            Pages::F32(_) => "f32",
            Pages::F16(_) => "f16",
            Pages::Bf16(_) => "bf16",
            Pages::Q8 { .. } => "int8 (q8_0)",
            Pages::Fp8 { .. } => "fp8 (e4m3)",
        }
    }
}

/// A paged cache and the sequences in it: key and value pages `[num_pages, page_size, Hkv, D]`,
/// `block_table: [B, max_pages]` (sequence `b`'s position `j` lives in page
/// `block_table[b][j / page_size]`, slot `j % page_size`) and `seqlens: [B]` (positions cached,
/// the new queries' included: FlashAttention's `cache_seqlens` after the append).
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// Key pages, `Dk` per row.
    pub k: Pages<'a>,
    /// Value pages, `Dv` per row.
    pub v: Pages<'a>,
    /// Positions per page (≥ 1).
    pub page_size: usize,
    /// Key/value heads `Hkv`.
    pub heads: usize,
    /// Key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// `[B, max_pages]`, row-major.
    pub block_table: &'a [i32],
    /// `[B]`.
    pub seqlens: &'a [i32],
}

/// Options of a paged call: [`crate::AttnParams`]'s that apply to a cache, with the queries
/// aligned bottom-right.
#[derive(Debug, Clone, Copy, Default)]
pub struct PagedParams<'a> {
    /// Multiplier of `q·k`; `None` means `1/√Dk`.
    pub scale: Option<f64>,
    /// Query `i` of `Lq` sees keys up to its own position `seqlen − Lq + i`.
    pub causal: bool,
    /// Keys within `left` before / `right` after the query's position (`right` ignored when
    /// causal).
    pub window: Option<Window>,
    /// Logit soft-capping `cap·tanh(s/cap)` of the scaled scores.
    pub softcap: Option<f64>,
    /// One sink logit per query head, `[Hq]` (see [`crate::AttnParams::sinks`]).
    pub sinks: Option<&'a [f32]>,
}

/// A validated cache: its sizes and the sequences' lengths and pages.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub b: usize,
    pub hq: usize,
    pub lq: usize,
    pub max_pages: usize,
    pub lens: Vec<usize>,
}

impl<'a> PagedKv<'a> {
    /// Pages held.
    pub fn num_pages(&self) -> usize {
        let row = self.page_size * self.heads * self.dk;
        self.k.len().checked_div(row).unwrap_or(0)
    }

    /// Checks the cache against `b` sequences: page storage sizes, scales, block table entries
    /// for every cached position, lengths; every error names its field.
    pub fn check(&self, b: usize) -> Result<Vec<usize>> {
        let param = |field, reason: String| Err(AttnError::Param { field, reason });
        if self.page_size == 0 {
            return param("page_size", "must be at least 1".into());
        }
        if self.heads == 0 {
            return Err(AttnError::Heads("the cache has no key/value head".into()));
        }
        let np = self.num_pages();
        for (name, pages, d) in [("k_pages", &self.k, self.dk), ("v_pages", &self.v, self.dv)] {
            let want = np * self.page_size * self.heads * d;
            if pages.len() != want {
                return Err(AttnError::Layout {
                    tensor: name,
                    reason: format!(
                        "{} elements, expected num_pages·page_size·Hkv·D = {np}·{}·{}·{d} = {want}",
                        pages.len(),
                        self.page_size,
                        self.heads
                    ),
                });
            }
            match pages {
                Pages::Q8 { scales, .. } => {
                    if !d.is_multiple_of(Q8_BLOCK) {
                        return param(name, format!("int8 pages need D a multiple of {Q8_BLOCK}, found {d}"));
                    }
                    if scales.len() != want / Q8_BLOCK {
                        return Err(AttnError::Layout {
                            tensor: name,
                            reason: format!("{} block scales, expected {}", scales.len(), want / Q8_BLOCK),
                        });
                    }
                }
                Pages::Fp8 { scales, .. } => {
                    if scales.len() != self.heads {
                        return Err(AttnError::DimMismatch {
                            tensor: name,
                            dim: "fp8 scales",
                            expected: self.heads,
                            found: scales.len(),
                        });
                    }
                    if let Some((h, s)) = scales.iter().enumerate().find(|(_, s)| !(s.is_finite() && **s > 0.0)) {
                        return param(name, format!("fp8 scale of head {h} is {s}; expected finite and positive"));
                    }
                }
                _ => {}
            }
        }
        if self.seqlens.len() != b {
            return Err(AttnError::DimMismatch {
                tensor: "cache_seqlens",
                dim: "B",
                expected: b,
                found: self.seqlens.len(),
            });
        }
        if b == 0 {
            return Ok(Vec::new());
        }
        if !self.block_table.len().is_multiple_of(b) {
            return Err(AttnError::Layout {
                tensor: "block_table",
                reason: format!("{} entries, not [B = {b}, max_pages]", self.block_table.len()),
            });
        }
        let max_pages = self.block_table.len() / b;
        let mut lens = Vec::with_capacity(b);
        for (s, &n) in self.seqlens.iter().enumerate() {
            let Ok(n) = usize::try_from(n) else {
                return param("cache_seqlens", format!("entry {s} is {n}; expected ≥ 0"));
            };
            let pages = n.div_ceil(self.page_size);
            if pages > max_pages {
                return param(
                    "block_table",
                    format!(
                        "row {s} has {max_pages} pages, cache_seqlens[{s}] = {n} needs {pages} of {} positions",
                        self.page_size
                    ),
                );
            }
            for (p, &page) in self.block_table[s * max_pages..][..pages].iter().enumerate() {
                if usize::try_from(page).map_or(true, |x| x >= np) {
                    return param("block_table", format!("entry [{s}][{p}] is {page}; pages are 0..{np}"));
                }
            }
            lens.push(n);
        }
        Ok(lens)
    }

    /// Which storage the keys and values use, for messages: `"f32"`, `"int8 (q8_0)"`, ...
    pub fn kinds(&self) -> (&'static str, &'static str) {
        (self.k.kind(), self.v.kind())
    }

    /// Sequence `s`'s cache made dense and dequantized (the values the kernel attends to):
    /// `(k: [Hkv, len, Dk], v: [Hkv, len, Dv])`. For the oracle and for callers that need a
    /// dense copy; [`check`](Self::check) must have passed.
    pub fn gather(&self, s: usize) -> (Vec<f32>, Vec<f32>) {
        let b = self.seqlens.len();
        let max_pages = self.block_table.len() / b.max(1);
        let n = usize::try_from(self.seqlens[s]).unwrap_or(0);
        let one = |pages: &Pages, d: usize| {
            let mut out = vec![0.0f32; self.heads * n * d];
            for j in 0..n {
                let page = self.block_table[s * max_pages + j / self.page_size] as usize;
                for h in 0..self.heads {
                    let r = (page * self.page_size + j % self.page_size) * self.heads + h;
                    pages.widen_row(r, self.heads, d, &mut out[(h * n + j) * d..][..d]);
                }
            }
            out
        };
        (one(&self.k, self.dk), one(&self.v, self.dv))
    }
}

/// Checks a paged call's queries, cache and options and sizes its outputs.
pub(crate) fn layout(q: &View4<f32>, cache: &PagedKv, p: &PagedParams) -> Result<Layout> {
    let [b, hq, lq, dk] = q.dims();
    let lens = cache.check(b)?;
    if dk != cache.dk {
        return Err(AttnError::DimMismatch { tensor: "q", dim: "D", expected: cache.dk, found: dk });
    }
    if hq == 0 || !hq.is_multiple_of(cache.heads) {
        return Err(AttnError::Heads(format!("{hq} query heads are not a multiple of the cache's {}", cache.heads)));
    }
    if let Some(s) = p.scale.filter(|s| !s.is_finite()) {
        return Err(AttnError::Param { field: "softmax_scale", reason: format!("{s} is not finite") });
    }
    if let Some(c) = p.softcap.filter(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(AttnError::Param { field: "softcap", reason: format!("{c}; expected finite and positive") });
    }
    if let Some(s) = p.sinks.filter(|s| s.len() != hq) {
        return Err(AttnError::DimMismatch { tensor: "sinks", dim: "Hq", expected: hq, found: s.len() });
    }
    let max_pages = cache.block_table.len().checked_div(b).unwrap_or(0);
    Ok(Layout { b, hq, lq, max_pages, lens })
}

pub use crate::flash::paged::paged_attention;
