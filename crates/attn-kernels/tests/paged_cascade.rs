//! Cascade attention (`attn_kernels::paged::cascade_attention`: a shared prefix in one pass,
//! the suffixes in another) against the f64 reference on the flat cache under the oracle rule, for
//! every storage, with the prefix's pages shuffled (gathered) and in order (read in place); and
//! its refusals.

use attn_kernels::paged::{cascade_attention, PagedKv, PagedParams};
use attn_kernels::{View4, Window};
use attn_testkit::oracle::{check, OUTPUT_FACTOR};

use crate::paged::{cache, data, params, reference_on_gathered, Case, Data, Store, KINDS};

/// A flat cache whose sequences share their first `prefix` positions (sequence 0's pages), and
/// the same cache cut for cascade attention: the prefix's table row and the suffixes' rows.
struct Shared {
    flat: Vec<i32>,
    prefix_table: Vec<i32>,
    suffix_table: Vec<i32>,
    suffix_lens: Vec<i32>,
}

fn shared(c: &Case, dt: &Data, prefix: usize) -> Shared {
    let (mp, np) = (dt.max_pages, prefix / c.page_size);
    let mut flat = dt.table.clone();
    for s in 1..c.lens.len() {
        flat.copy_within(0..np, s * mp);
    }
    let mut suffix_table = vec![0i32; c.lens.len() * mp];
    for s in 0..c.lens.len() {
        suffix_table[s * mp..s * mp + mp - np].copy_from_slice(&flat[s * mp + np..(s + 1) * mp]);
    }
    let suffix_lens = c.lens.iter().map(|&n| (n - prefix) as i32).collect();
    Shared { prefix_table: flat[..np].to_vec(), flat, suffix_table, suffix_lens }
}

#[test]
fn cascade_attention_equals_the_flat_cache_under_the_oracle_rule() {
    let base = Case::new(6, 2, 1, 32, 16, &[48 + 5, 48 + 3, 48 + 40, 48 + 17]);
    let cases = [
        ("decode", base.clone_with(1, true)),
        ("chunked prefill of 3", base.clone_with(3, true)),
        ("non-causal", base.clone_with(2, false)),
        ("prefix pages in order (read in place)", Case { in_order: true, ..base.clone_with(2, true) }),
        (
            "sinks and soft-cap",
            Case {
                sinks: Some(vec![0.5, -1.0, f32::NEG_INFINITY, 2.0, 0.0, 1.0]),
                softcap: Some(4.0),
                ..base.clone_with(1, true)
            },
        ),
    ];
    for (name, c) in &cases {
        for kind in KINDS {
            let dt = data(c, 21);
            let sh = shared(c, &dt, 48);
            let (k, v) = (Store::new(kind, &dt.k, c.hkv, c.d), Store::new(kind, &dt.v, c.hkv, c.d));
            let flat = PagedKv { block_table: &sh.flat, ..cache(c, &dt, &k, &v) };
            let prefix = PagedKv { block_table: &sh.prefix_table, seqlens: &[48], ..flat };
            let suffix = PagedKv { block_table: &sh.suffix_table, seqlens: &sh.suffix_lens, ..flat };
            let b = c.lens.len();
            let q = View4::contiguous("q", &dt.q, [b, c.hq, c.lq, c.d]).unwrap();
            let (mut out, mut lse) = (vec![f32::NAN; b * c.hq * c.lq * c.d], vec![f32::NAN; b * c.hq * c.lq]);
            cascade_attention(&q, &prefix, &suffix, &params(c), &mut out, &mut lse).unwrap();
            let (r_out, r_lse) = reference_on_gathered::<f64>(c, &flat, &dt.q);
            let (n_out, n_lse) = reference_on_gathered::<f32>(c, &flat, &dt.q);
            check(&format!("cascade {name} ({kind}) out"), &out, &r_out, &n_out, OUTPUT_FACTOR).unwrap();
            check(&format!("cascade {name} ({kind}) lse"), &lse, &r_lse, &n_lse, OUTPUT_FACTOR).unwrap();
        }
    }
    let c = base.clone_with(1, true);
    let dt = data(&c, 2);
    let sh = shared(&c, &dt, 48);
    let (k, v) = (Store::new("f32", &dt.k, c.hkv, c.d), Store::new("f32", &dt.v, c.hkv, c.d));
    let flat = PagedKv { block_table: &sh.flat, ..cache(&c, &dt, &k, &v) };
    let prefix = PagedKv { block_table: &sh.prefix_table, seqlens: &[48], ..flat };
    let suffix = PagedKv { block_table: &sh.suffix_table, seqlens: &sh.suffix_lens, ..flat };
    let q = View4::contiguous("q", &dt.q, [4, 6, 1, 32]).unwrap();
    let (mut o, mut l) = (vec![0.0; 4 * 6 * 32], vec![0.0; 24]);
    let window = PagedParams { window: Some(Window { left: Some(4), right: None }), ..params(&c) };
    let e = cascade_attention(&q, &prefix, &suffix, &window, &mut o, &mut l).unwrap_err().to_string();
    assert!(e.contains("window"), "{e}");
    let two = PagedKv { seqlens: &[48, 48], ..prefix };
    let e = cascade_attention(&q, &two, &suffix, &params(&c), &mut o, &mut l).unwrap_err().to_string();
    assert!(e.contains("prefix seqlens"), "{e}");
    let e = cascade_attention(&q, &prefix, &PagedKv { seqlens: &[0, 3, 1, 1], ..suffix }, &params(&c), &mut o, &mut l)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cache_seqlens: suffix 0 holds 0 positions"), "{e}");
}
