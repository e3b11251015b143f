//! The paged KV cache: appends across pages equal the concatenation of what was written (as
//! stored: exact in f32, rounded as the storage rounds otherwise), forks share pages and copy a
//! shared page before writing it, freed pages are reused, attention over a batch of sequences
//! equals attention over each one's dense cache, and refusals name their argument.

use attn::cache::{CacheConfig, KvDtype, PagedCache, PagedParams, SeqId};
use attn::{Align, SdpaOptions, Window};
use candle_core::{DType, Tensor};

use crate::common::{flat, max_diff, uniform};

fn cache(page_size: usize, dtype: KvDtype) -> PagedCache {
    PagedCache::new(CacheConfig { page_size, heads: 2, dk: 32, dv: 64, dtype }).unwrap()
}

/// Keys `[n, 2, 32]` and values `[n, 2, 64]` from `seed`.
fn kv(n: usize, seed: u64) -> (Tensor, Tensor) {
    (uniform(&[n, 2, 32], seed), uniform(&[n, 2, 64], seed + 1000))
}

/// `[n, H, D]` chunks concatenated along positions and laid out `[H, n, D]`, as `gather` gives.
fn dense(chunks: &[Tensor]) -> Tensor {
    Tensor::cat(chunks, 0).unwrap().transpose(0, 1).unwrap().contiguous().unwrap()
}

/// Appends chunks of `sizes` to `seq`, returning what was written.
fn fill(c: &mut PagedCache, seq: SeqId, sizes: &[usize], seed: u64) -> (Vec<Tensor>, Vec<Tensor>) {
    let (mut ks, mut vs) = (vec![], vec![]);
    for (i, &n) in sizes.iter().enumerate() {
        let (k, v) = kv(n, seed + i as u64);
        c.append(seq, &k, &v).unwrap();
        ks.push(k);
        vs.push(v);
    }
    (ks, vs)
}

#[test]
fn appends_across_pages_equal_the_concatenation_as_stored() {
    for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Int8, KvDtype::Fp8] {
        for page_size in [1, 16, 5] {
            let mut c = cache(page_size, dtype);
            let (a, b) = (c.allocate(), c.allocate());
            // Interleaved writes: the two sequences' pages alternate in the storage.
            let (ka, va) = fill(&mut c, a, &[3, 17, 0, 1, 40], 1);
            let (kb, vb) = fill(&mut c, b, &[16, 1, 33], 50);
            assert_eq!((c.len(a).unwrap(), c.len(b).unwrap()), (61, 50));
            for (seq, ks, vs) in [(a, &ka, &va), (b, &kb, &vb)] {
                let (gk, gv) = c.gather(seq).unwrap();
                let (wk, wv) = (dense(ks), dense(vs));
                let (ek, ev) = (max_diff(&flat(&gk), &flat(&wk)), max_diff(&flat(&gv), &flat(&wv)));
                // Inputs lie in [-1, 1): each storage's worst rounding there.
                let tol = match dtype {
                    KvDtype::F32 => 0.0,
                    KvDtype::F16 => 2f32.powi(-11),
                    KvDtype::Bf16 => 2f32.powi(-8),
                    KvDtype::Int8 => 0.5 / 127.0 + 1e-3,
                    KvDtype::Fp8 => 2f32.powi(-4),
                };
                assert!(ek <= tol && ev <= tol, "{dtype} page {page_size}: k {ek}, v {ev} > {tol}");
            }
        }
    }
}

#[test]
fn a_fork_shares_pages_and_copies_a_shared_page_before_writing_it() {
    let mut c = cache(16, KvDtype::F32);
    let parent = c.allocate();
    let (mut kp, mut vp) = fill(&mut c, parent, &[40], 1);
    assert_eq!(c.pages_in_use(), 3);
    let child = c.fork(parent).unwrap();
    assert_eq!(c.pages_in_use(), 3, "a fork takes no page of its own");
    let (mut kc, mut vc) = (kp.clone(), vp.clone());
    // Both write into the shared, partly filled third page: each gets its own copy of it.
    let (k1, v1) = fill(&mut c, child, &[5], 7);
    let (k2, v2) = fill(&mut c, parent, &[30], 9);
    kc.extend(k1);
    vc.extend(v1);
    kp.extend(k2);
    vp.extend(v2);
    for (seq, ks, vs) in [(parent, &kp, &vp), (child, &kc, &vc)] {
        let (gk, gv) = c.gather(seq).unwrap();
        assert_eq!(flat(&gk), flat(&dense(ks)));
        assert_eq!(flat(&gv), flat(&dense(vs)));
    }
    // Two shared full pages, the child's copy of the third, the parent's third to fifth.
    assert_eq!(c.pages_in_use(), 2 + 1 + 3);
    c.free(parent).unwrap();
    assert_eq!(c.pages_in_use(), 3, "the shared pages stay with the child");
    let (gk, _) = c.gather(child).unwrap();
    assert_eq!(flat(&gk), flat(&dense(&kc)));
    c.free(child).unwrap();
    assert_eq!(c.pages_in_use(), 0);
    let pages = c.num_pages();
    let again = c.allocate();
    fill(&mut c, again, &[16 * pages], 3);
    assert_eq!(c.num_pages(), pages, "freed pages are reused before the cache grows");
}

#[test]
fn attention_over_a_batch_equals_each_sequence_on_its_dense_cache() {
    let lens = [[37usize, 1], [1, 0], [70, 3]];
    let window = Window { left: Some(20), right: None };
    for page_size in [1, 16] {
        let mut c = cache(page_size, KvDtype::F32);
        let seqs: Vec<SeqId> = (0..3).map(|_| c.allocate()).collect();
        for step in 0..2 {
            for (i, (s, l)) in seqs.iter().zip(&lens).enumerate() {
                fill(&mut c, *s, &[l[step]], (10 * step + i) as u64);
            }
        }
        // Three new queries per sequence (4 query heads on 2 kv heads): chunked prefill.
        let q = uniform(&[3, 4, 3, 32], 77);
        for win in [None, Some(window)] {
            let p = PagedParams { causal: true, window: win, ..Default::default() };
            let (out, lse) = c.attend(&q, &seqs, &p).unwrap();
            assert_eq!((out.dims(), lse.dims()), (&[3, 4, 3, 64][..], &[3, 4, 3][..]));
            for (b, &s) in seqs.iter().enumerate() {
                let (k, v) = c.gather(s).unwrap();
                let mut opts = SdpaOptions::default().causal(true).align(Align::BottomRight);
                if let Some(w) = win {
                    opts = opts.window(w.left, Some(0));
                }
                let want = attn::sdpa_full(
                    &q.narrow(0, b, 1).unwrap(),
                    &k.unsqueeze(0).unwrap(),
                    &v.unsqueeze(0).unwrap(),
                    &opts,
                )
                .unwrap();
                let got = out.narrow(0, b, 1).unwrap();
                let e = max_diff(&flat(&got), &flat(&want.out));
                assert!(e < 1e-5, "page {page_size}, window {win:?}, sequence {b}: {e}");
            }
        }
    }
}

#[test]
fn quantized_caches_attend_close_to_f32() {
    let q = uniform(&[1, 4, 1, 32], 5);
    let mut reference = None;
    for dtype in [KvDtype::F32, KvDtype::Bf16, KvDtype::Int8, KvDtype::Fp8] {
        let mut c = cache(16, dtype);
        let s = c.allocate();
        fill(&mut c, s, &[300, 1], 11);
        let out = flat(&c.attend(&q, &[s], &PagedParams { causal: true, ..Default::default() }).unwrap().0);
        let want = reference.get_or_insert_with(|| out.clone());
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let tol = if dtype == KvDtype::Fp8 { 0.1 } else { 0.02 };
        assert!(max_diff(&out, want) <= tol * scale, "{dtype}: {} vs {scale}", max_diff(&out, want));
    }
}

#[test]
fn refusals_name_their_argument_and_write_nothing() {
    let err = |r: attn::Result<()>| r.unwrap_err().to_string();
    let mut c = cache(16, KvDtype::F32);
    let s = c.allocate();
    let (k, v) = kv(4, 1);
    assert!(err(c.append(s, &k.narrow(2, 0, 16).unwrap(), &v)).starts_with("k: shape [4, 2, 16]"));
    assert!(err(c.append(s, &k, &v.narrow(0, 0, 3).unwrap())).starts_with("v: shape [3, 2, 64]"));
    let nan = (k.clone() * f64::NAN).unwrap();
    assert!(err(c.append(s, &nan, &v)).starts_with("k: holds a NaN"));
    assert_eq!(c.len(s).unwrap(), 0, "a refused append wrote positions");
    c.free(s).unwrap();
    assert!(err(c.append(s, &k, &v)).contains("not in this cache"));
    assert!(err(c.free(s)).contains("not in this cache"));
    let cfg = CacheConfig { page_size: 16, heads: 2, dk: 48, dv: 64, dtype: KvDtype::Int8 };
    assert!(PagedCache::new(cfg).unwrap_err().to_string().starts_with("kv_dtype: int8 stores blocks of 32"));
    assert!(PagedCache::new(CacheConfig { page_size: 0, ..cfg }).unwrap_err().to_string().starts_with("page_size"));
    let t = c.allocate();
    let q = uniform(&[2, 4, 1, 32], 1);
    assert!(c.attend(&q, &[t], &PagedParams::default()).unwrap_err().to_string().starts_with("q: shape [2, 4, 1, 32]"));
    let q3 = q.to_dtype(DType::F32).unwrap().narrow(0, 0, 1).unwrap().squeeze(0).unwrap();
    assert!(c.attend(&q3, &[t], &PagedParams::default()).unwrap_err().to_string().contains("rank 4"));
}
