//! The paged cache (`attn_kernels::paged`) against the f64 reference on the gathered, dequantized
//! cache of each sequence under the oracle rule: every storage (f32, f16, bf16, q8_0, fp8),
//! pages in random order, partly filled last pages, page sizes 1, 16 and 48, sequences of
//! length 0 and 1, decode and chunked prefill (bottom-right causal), windows crossing page
//! boundaries, soft-capping, sinks, grouped heads and sequences long enough to be split over
//! shards; the quantized caches' distance from the f32 one; every malformed input refused by
//! name. Its cache builders serve `paged_cascade.rs` too.

use crate::common::Rng;

use attn_kernels::paged::{fp8_encode, paged_attention, q8_encode, PagedKv, PagedParams, Pages, FP8_MAX, Q8_BLOCK};
use attn_kernels::{reference, Align, AttnError, AttnParams, MaskSpec, View4, Window};
use attn_testkit::oracle::{check, OUTPUT_FACTOR};
use half::{bf16, f16};

/// One tensor of a cache in a storage.
pub(crate) enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Q8(Vec<i8>, Vec<f16>),
    Fp8(Vec<u8>, Vec<f32>),
}

impl Store {
    /// `x: [num_pages, page_size, heads, d]` stored as `kind`.
    pub(crate) fn new(kind: &str, x: &[f32], heads: usize, d: usize) -> Store {
        match kind {
            "f32" => Store::F32(x.to_vec()),
            "f16" => Store::F16(x.iter().map(|&v| f16::from_f32(v)).collect()),
            "bf16" => Store::Bf16(x.iter().map(|&v| bf16::from_f32(v)).collect()),
            "int8" => {
                let (mut q, mut s) = (vec![0i8; x.len()], vec![f16::ZERO; x.len() / Q8_BLOCK]);
                q8_encode(x, &mut q, &mut s);
                Store::Q8(q, s)
            }
            "fp8" => {
                let rows = x.len() / d;
                let mut amax = vec![0.0f32; heads];
                for r in 0..rows {
                    amax[r % heads] = x[r * d..(r + 1) * d].iter().fold(amax[r % heads], |m, v| m.max(v.abs()));
                }
                let scales: Vec<f32> = amax.iter().map(|a| a.max(1e-6) / FP8_MAX).collect();
                let q = x.iter().enumerate().map(|(i, &v)| fp8_encode(v / scales[(i / d) % heads])).collect();
                Store::Fp8(q, scales)
            }
            _ => unreachable!("storage {kind}"),
        }
    }

    fn pages(&self) -> Pages<'_> {
        match self {
            Store::F32(x) => Pages::F32(x),
            Store::F16(x) => Pages::F16(x),
            Store::Bf16(x) => Pages::Bf16(x),
            Store::Q8(values, scales) => Pages::Q8 { values, scales },
            Store::Fp8(values, scales) => Pages::Fp8 { values, scales },
        }
    }
}

/// A paged call's inputs.
pub(crate) struct Case {
    pub(crate) hq: usize,
    pub(crate) hkv: usize,
    pub(crate) lq: usize,
    pub(crate) d: usize,
    pub(crate) page_size: usize,
    pub(crate) lens: Vec<usize>,
    pub(crate) causal: bool,
    pub(crate) window: Option<Window>,
    pub(crate) softcap: Option<f64>,
    pub(crate) sinks: Option<Vec<f32>>,
    /// Pages handed out in order (sequence 0's first, each sequence's consecutive) instead of
    /// shuffled.
    pub(crate) in_order: bool,
}

impl Case {
    /// The same case with `lq` queries per sequence, causal or not.
    pub(crate) fn clone_with(&self, lq: usize, causal: bool) -> Case {
        Case { lq, causal, lens: self.lens.clone(), sinks: self.sinks.clone(), ..*self }
    }

    pub(crate) fn new(hq: usize, hkv: usize, lq: usize, d: usize, page_size: usize, lens: &[usize]) -> Case {
        Case {
            hq,
            hkv,
            lq,
            d,
            page_size,
            lens: lens.to_vec(),
            causal: true,
            window: None,
            softcap: None,
            sinks: None,
            in_order: false,
        }
    }
}

/// The cache's f32 pages, block table (pages of each sequence in random order among all pages, a
/// spare page never used) and the queries.
pub(crate) struct Data {
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) table: Vec<i32>,
    pub(crate) max_pages: usize,
    pub(crate) lens: Vec<i32>,
    pub(crate) q: Vec<f32>,
}

pub(crate) fn data(c: &Case, seed: u64) -> Data {
    let mut rng = Rng::new(seed);
    let pages_of: Vec<usize> = c.lens.iter().map(|n| n.div_ceil(c.page_size)).collect();
    let max_pages = pages_of.iter().copied().max().unwrap_or(0) + 1;
    let np = pages_of.iter().sum::<usize>() + 1;
    let mut order: Vec<usize> = (0..np).collect();
    for i in (1..np).rev().filter(|_| !c.in_order) {
        order.swap(i, rng.below(i + 1));
    }
    let mut table = vec![-1i32; c.lens.len() * max_pages];
    let mut next = 0;
    for (s, &n) in pages_of.iter().enumerate() {
        for p in 0..n {
            table[s * max_pages + p] = order[next] as i32;
            next += 1;
        }
    }
    // Entries past a sequence's pages are never read: leave some valid, some −1.
    for (x, t) in table.iter_mut().enumerate() {
        if *t < 0 && x % 2 == 0 {
            *t = 0;
        }
    }
    let row = np * c.page_size * c.hkv * c.d;
    Data {
        k: rng.values(row, 1.5),
        v: rng.values(row, 1.0),
        table,
        max_pages,
        lens: c.lens.iter().map(|&n| n as i32).collect(),
        q: rng.values(c.lens.len() * c.hq * c.lq * c.d, 1.5),
    }
}

pub(crate) fn cache<'a>(c: &Case, dt: &'a Data, k: &'a Store, v: &'a Store) -> PagedKv<'a> {
    PagedKv {
        k: k.pages(),
        v: v.pages(),
        page_size: c.page_size,
        heads: c.hkv,
        dk: c.d,
        dv: c.d,
        block_table: &dt.table,
        seqlens: &dt.lens,
    }
}

pub(crate) fn params(c: &Case) -> PagedParams<'_> {
    PagedParams { scale: None, causal: c.causal, window: c.window, softcap: c.softcap, sinks: c.sinks.as_deref() }
}

/// Outputs and log-sum-exps `[B, Hq, Lq, ·]` of the paged kernel.
fn fast(c: &Case, kv: &PagedKv, q: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let b = c.lens.len();
    let qv = View4::contiguous("q", q, [b, c.hq, c.lq, c.d]).unwrap();
    let (mut out, mut lse) = (vec![f32::NAN; b * c.hq * c.lq * c.d], vec![f32::NAN; b * c.hq * c.lq]);
    paged_attention(&qv, kv, &params(c), &mut out, &mut lse).unwrap();
    (out, lse)
}

/// The reference in `T` on each sequence's gathered cache, concatenated as the kernel lays them.
pub(crate) fn reference_on_gathered<T: attn_kernels::Real>(c: &Case, kv: &PagedKv, q: &[f32]) -> (Vec<T>, Vec<T>) {
    let t = |x: &[f32]| x.iter().map(|&v| T::from(v).unwrap()).collect::<Vec<T>>();
    let sinks = c.sinks.as_deref().map(t);
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for s in 0..c.lens.len() {
        let (k, v) = kv.gather(s);
        let n = c.lens[s];
        let qs = t(&q[s * c.hq * c.lq * c.d..][..c.hq * c.lq * c.d]);
        let (k, v) = (t(&k), t(&v));
        let qv = View4::contiguous("q", &qs, [1, c.hq, c.lq, c.d]).unwrap();
        let kv4 = View4::contiguous("k", &k, [1, c.hkv, n, c.d]).unwrap();
        let vv4 = View4::contiguous("v", &v, [1, c.hkv, n, c.d]).unwrap();
        let p = AttnParams {
            mask: MaskSpec { causal: c.causal, window: c.window, align: Align::BottomRight, ..Default::default() },
            softcap: c.softcap,
            sinks: sinks.as_deref(),
            ..Default::default()
        };
        let r = reference(&qv, &kv4, &vv4, &p, false).unwrap();
        out.extend(r.out);
        lse.extend(r.lse);
    }
    (out, lse)
}

fn assert_oracle(name: &str, c: &Case, kind: &str, seed: u64) {
    let dt = data(c, seed);
    let (k, v) = (Store::new(kind, &dt.k, c.hkv, c.d), Store::new(kind, &dt.v, c.hkv, c.d));
    let kv = cache(c, &dt, &k, &v);
    let (out, lse) = fast(c, &kv, &dt.q);
    let (r_out, r_lse) = reference_on_gathered::<f64>(c, &kv, &dt.q);
    let (n_out, n_lse) = reference_on_gathered::<f32>(c, &kv, &dt.q);
    check(&format!("{name} ({kind}) out"), &out, &r_out, &n_out, OUTPUT_FACTOR).unwrap();
    check(&format!("{name} ({kind}) lse"), &lse, &r_lse, &n_lse, OUTPUT_FACTOR).unwrap();
}

pub(crate) const KINDS: [&str; 5] = ["f32", "f16", "bf16", "int8", "fp8"];

fn cases() -> Vec<(&'static str, Case)> {
    vec![
        ("decode, gqa 6/2, page 16", Case::new(6, 2, 1, 32, 16, &[37, 1, 0, 64, 130])),
        ("decode, page 1", Case::new(4, 4, 1, 64, 1, &[5, 23, 1])),
        // Consecutive pages: their keys are read as one run, across page edges and chunks.
        ("decode, page 1, pages in order", Case { in_order: true, ..Case::new(4, 2, 1, 64, 1, &[150, 3]) }),
        (
            "chunked prefill of 3, page 16, pages in order",
            Case { in_order: true, ..Case::new(4, 2, 3, 32, 16, &[150, 20]) },
        ),
        ("chunked prefill of 5, page 16", Case::new(4, 2, 5, 32, 16, &[40, 5, 3, 17])),
        ("non-causal, page 48", Case { causal: false, ..Case::new(2, 1, 3, 64, 48, &[100, 47, 49]) }),
        (
            "window crossing pages",
            Case { window: Some(Window { left: Some(21), right: None }), ..Case::new(4, 2, 4, 32, 16, &[90, 18, 33]) },
        ),
        (
            // Row 0's window ends in the first chunk of 64 keys, row 8's starts in the second.
            "narrow window, rows in different chunks",
            Case { window: Some(Window { left: Some(3), right: None }), ..Case::new(2, 1, 9, 32, 16, &[71, 130]) },
        ),
        ("soft-cap", Case { softcap: Some(3.0), ..Case::new(2, 2, 2, 32, 16, &[70, 9]) }),
        (
            "sinks, one head without",
            Case { sinks: Some(vec![0.5, f32::NEG_INFINITY, 2.0, -1.0]), ..Case::new(4, 2, 1, 32, 16, &[60, 0, 3]) },
        ),
        ("split over shards", Case::new(8, 2, 1, 64, 32, &[3000, 1700])),
        ("head dimension 96, prefill past the row block", Case::new(16, 1, 9, 96, 16, &[300])),
    ]
}

#[test]
fn every_storage_matches_the_reference_on_its_gathered_cache() {
    for (x, (name, c)) in cases().iter().enumerate() {
        for kind in KINDS {
            assert_oracle(name, c, kind, 100 + x as u64);
        }
    }
}

#[test]
fn quantized_caches_stay_close_to_the_f32_one() {
    let c = Case::new(8, 2, 1, 128, 16, &[700, 300]);
    let dt = data(&c, 9);
    let (k, v) = (Store::new("f32", &dt.k, c.hkv, c.d), Store::new("f32", &dt.v, c.hkv, c.d));
    let (want, _) = fast(&c, &cache(&c, &dt, &k, &v), &dt.q);
    let amax = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    for (kind, tol) in [("bf16", 0.02), ("int8", 0.02), ("fp8", 0.1)] {
        let (k, v) = (Store::new(kind, &dt.k, c.hkv, c.d), Store::new(kind, &dt.v, c.hkv, c.d));
        let (got, _) = fast(&c, &cache(&c, &dt, &k, &v), &dt.q);
        let err = got.iter().zip(&want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= tol * amax, "{kind}: max error {err} against outputs up to {amax}");
        assert!(err > 0.0, "{kind}: a quantized cache equal to f32 bit for bit means it was not quantized");
    }
}

#[test]
fn malformed_caches_are_refused_by_name() {
    let c = Case::new(4, 2, 1, 32, 16, &[20, 40]);
    let dt = data(&c, 3);
    let (k, v) = (Store::new("f32", &dt.k, c.hkv, c.d), Store::new("f32", &dt.v, c.hkv, c.d));
    let q = View4::contiguous("q", &dt.q, [2, 4, 1, 32]).unwrap();
    let run = |kv: &PagedKv, p: &PagedParams| {
        let (mut o, mut l) = (vec![0.0; 2 * 4 * 32], vec![0.0; 8]);
        paged_attention(&q, kv, p, &mut o, &mut l).unwrap_err()
    };
    let good = cache(&c, &dt, &k, &v);
    let field = |e: AttnError| match e {
        AttnError::Param { field, reason } => format!("{field}: {reason}"),
        AttnError::Layout { tensor, reason } => format!("{tensor}: {reason}"),
        AttnError::DimMismatch { tensor, dim, .. } => format!("{tensor}: {dim}"),
        AttnError::Heads(r) => format!("heads: {r}"),
        AttnError::Output { tensor, .. } => format!("output {tensor}"),
        e => panic!("unexpected {e:?}"),
    };
    let p = PagedParams::default();
    let mut bad_table = dt.table.clone();
    bad_table[dt.max_pages] = 99;
    let e = field(run(&PagedKv { block_table: &bad_table, ..good }, &p));
    assert!(e.starts_with("block_table: entry [1][0] is 99"), "{e}");
    bad_table[dt.max_pages] = -2;
    let e = field(run(&PagedKv { block_table: &bad_table, ..good }, &p));
    assert!(e.contains("entry [1][0] is -2"), "{e}");
    let short = [20, 16 * dt.max_pages as i32 + 1];
    let e = field(run(&PagedKv { seqlens: &short, ..good }, &p));
    assert!(e.starts_with("block_table: row 1 has"), "{e}");
    let e = field(run(&PagedKv { seqlens: &[20, -1], ..good }, &p));
    assert!(e.starts_with("cache_seqlens: entry 1 is -1"), "{e}");
    let e = field(run(&PagedKv { seqlens: &[20], ..good }, &p));
    assert!(e.starts_with("cache_seqlens: B"), "{e}");
    let e = field(run(&PagedKv { v: Pages::F32(&dt.v[1..]), ..good }, &p));
    assert!(e.starts_with("v_pages:"), "{e}");
    let e = field(run(&PagedKv { block_table: &dt.table[1..], ..good }, &p));
    assert!(e.starts_with("block_table:"), "{e}");
    let e = field(run(&PagedKv { page_size: 0, ..good }, &p));
    assert!(e.starts_with("page_size"), "{e}");
    let e = field(run(&PagedKv { heads: 3, ..good }, &p));
    // 6 pages of 2 heads are 4 pages of 3: the table's entries 4 and 5 no longer exist.
    assert!(e.starts_with("block_table: entry"), "{e}");
    let e = field(run(&PagedKv { heads: 5, ..good }, &p));
    assert!(e.starts_with("k_pages:"), "{e}");
    let e = field(run(&good, &PagedParams { sinks: Some(&[0.0; 3]), ..p }));
    assert!(e.starts_with("sinks: Hq"), "{e}");
    let e = field(run(&good, &PagedParams { softcap: Some(0.0), ..p }));
    assert!(e.starts_with("softcap"), "{e}");
    let fp8 = Store::Fp8(vec![0; dt.k.len()], vec![1.0, 0.0]);
    let e = field(run(&PagedKv { k: fp8.pages(), ..good }, &p));
    assert!(e.contains("fp8 scale of head 1"), "{e}");
    let odd = Case::new(4, 2, 1, 24, 16, &[20, 40]);
    let dto = data(&odd, 4);
    let q8 = Store::Q8(vec![0; dto.k.len()], vec![f16::ZERO; dto.k.len() / 24]);
    let qo = View4::contiguous("q", &dto.q, [2, 4, 1, 24]).unwrap();
    let fo = Store::F32(dto.v.clone());
    let kv = cache(&odd, &dto, &q8, &fo);
    let (mut o, mut l) = (vec![0.0; 2 * 4 * 24], vec![0.0; 8]);
    let e = field(paged_attention(&qo, &kv, &p, &mut o, &mut l).unwrap_err());
    assert!(e.contains("multiple of 32"), "{e}");
    let (mut o, mut l) = (vec![0.0; 5], vec![0.0; 8]);
    let e = field(paged_attention(&q, &good, &p, &mut o, &mut l).unwrap_err());
    assert_eq!(e, "output out");
}
