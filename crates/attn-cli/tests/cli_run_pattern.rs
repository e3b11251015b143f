//! `attn run --pattern`: each named pattern's flags give the mask the pattern's definition says
//! (checked pair by pair against a predicate written here from the papers' definitions, and the
//! outputs and gradients against the `f64` reference under the same block mask); `--causal` and a
//! window the pattern does not take compose by AND; missing, foreign and bad parameters are
//! refused naming the flag, before anything is written.

use crate::common;

use std::sync::Arc;

use attn::sparse::Pattern;
use attn::Window;
use common::*;

/// Self-attention length: three blocks, the last one cut short.
const L: usize = 150;

/// Runs `attn run FLAGS --weights` on seeded `[1, 2, L, 8]` inputs; checks the outputs against
/// the reference with `pattern`'s block mask (and `causal`), and the written `mask` against
/// `allowed(i, j)` pair by pair. Returns the output line.
fn check_pattern(flags: &[&str], pattern: Pattern, causal: bool, allowed: impl Fn(usize, usize) -> bool) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[1, 2, L, 8], 21), f32_tensor(&[1, 2, L, 8], 22), f32_tensor(&[1, 2, L, 8], 23));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
    let out = out_path(dir.path());
    let mut args = flags.to_vec();
    args.extend(["--weights", "-o", out.to_str().unwrap()]);
    let (result, stdout) = run_ok(&args, &[&input], &out);
    let opts = SdpaOptions::default().causal(causal).block_mask(Arc::new(pattern.block_mask(L, L).unwrap()));
    Case::new(&q, &k, &v, opts).check(&result, true);
    let HostData::Bool(mask) = &result["mask"].data else { panic!("mask is not BOOL") };
    for h in 0..2 {
        for i in 0..L {
            for j in 0..L {
                assert_eq!(mask[(h * L + i) * L + j], allowed(i, j), "{flags:?}: head {h}, query {i}, key {j}");
            }
        }
    }
    stdout
}

#[test]
fn strided_and_fixed_are_sparse_transformer_heads() {
    let line =
        check_pattern(&["--pattern", "strided", "--stride", "7"], Pattern::Strided { stride: 7 }, false, |i, j| {
            j <= i && (i - j < 7 || (i - j) % 7 == 0)
        });
    assert!(line.contains("pattern strided stride=7 (") && line.contains("of blocks)"), "{line}");
    check_pattern(
        &["--pattern", "fixed", "--stride", "40", "--summary", "5"],
        Pattern::Fixed { stride: 40, summary: 5 },
        false,
        |i, j| j <= i && (j / 40 == i / 40 || j % 40 >= 35),
    );
}

#[test]
fn longformer_and_bigbird_unite_window_and_global_rows_and_columns() {
    let w = Window { left: Some(9), right: Some(4) };
    let longformer = |i: usize, j: usize| (j + 9 >= i && j <= i + 4) || i < 3 || j < 3;
    check_pattern(
        &["--pattern", "longformer", "--window", "9,4", "--global", "3"],
        Pattern::Longformer { window: w, global: 3 },
        false,
        longformer,
    );
    // --causal is no part of the pattern: it composes by AND (the global rows lose their future).
    check_pattern(
        &["--pattern", "longformer", "--window", "9,4", "--global", "3", "--causal"],
        Pattern::Longformer { window: w, global: 3 },
        true,
        |i, j| j <= i && longformer(i, j),
    );
    // BigBird is Longformer's pattern and whole random key blocks, the same for every query of a
    // query block.
    let bigbird = Pattern::BigBird { window: w, global: 3, random: 1, seed: 11 };
    let random = bigbird.block_mask(L, L).unwrap();
    let from_blocks = |i: usize, j: usize| longformer(i, j) || random.allows(0, 0, i, j);
    check_pattern(
        &["--pattern", "bigbird", "--window", "9,4", "--global", "3", "--random", "1", "--seed", "11"],
        bigbird,
        false,
        from_blocks,
    );
    let outside_longformer = (0..L).flat_map(|i| (0..L).map(move |j| (i, j))).filter(|&(i, j)| !longformer(i, j));
    assert!(outside_longformer.filter(|&(i, j)| random.allows(0, 0, i, j)).count() >= 64, "random blocks are added");
}

#[test]
fn document_prefix_lm_and_sinks() {
    let doc = |i: usize| {
        if i < 50 {
            0
        } else if i < 120 {
            1
        } else {
            2
        }
    };
    check_pattern(
        &["--pattern", "document", "--doc-lengths", "50,70,30"],
        Pattern::Document { lengths: vec![50, 70, 30] },
        false,
        |i, j| j <= i && doc(i) == doc(j),
    );
    check_pattern(&["--pattern", "prefix-lm", "--prefix", "70"], Pattern::PrefixLm { prefix: 70 }, false, |i, j| {
        j < 70 || j <= i
    });
    // --window 15,0: the query and the 15 keys before it.
    check_pattern(
        &["--pattern", "sinks", "--sink-tokens", "4", "--window", "15,0"],
        Pattern::Sinks { sinks: 4, window: 16 },
        false,
        |i, j| j <= i && (j < 4 || i - j <= 15),
    );
}

#[test]
fn a_window_the_pattern_does_not_take_is_the_calls_own() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[1, 1, L, 8], 31), f32_tensor(&[1, 1, L, 8], 32), f32_tensor(&[1, 1, L, 8], 33));
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
    let out = out_path(dir.path());
    let args =
        ["--pattern", "prefix-lm", "--prefix", "60", "--window", "20,5", "--weights", "-o", out.to_str().unwrap()];
    let (result, _) = run_ok(&args, &[&input], &out);
    let HostData::Bool(mask) = &result["mask"].data else { panic!("mask is not BOOL") };
    for i in 0..L {
        for j in 0..L {
            // Inside the prefix a query also sees up to 5 keys ahead; after it, none.
            let want = (j < 60 || j <= i) && j + 20 >= i && j <= i + 5;
            assert_eq!(mask[i * L + j], want, "query {i}, key {j}");
        }
    }
}

#[test]
fn gradients_through_a_pattern_match_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (q, k, v) = (f32_tensor(&[1, 4, L, 8], 41), f32_tensor(&[1, 2, L, 8], 42), f32_tensor(&[1, 2, L, 8], 43));
    let dout = f32_tensor(&[1, 4, L, 8], 44);
    let input = dir.path().join("in.safetensors");
    write(&input, &[("q", &q), ("k", &k), ("v", &v), ("grad_out", &dout)]);
    let out = out_path(dir.path());
    let args =
        ["--pattern", "bigbird", "--window", "8,8", "--global", "2", "--random", "1", "-o", out.to_str().unwrap()];
    let (result, _) = run_ok(&args, &[&input], &out);
    let pattern = Pattern::BigBird { window: Window { left: Some(8), right: Some(8) }, global: 2, random: 1, seed: 0 };
    let case = Case::new(&q, &k, &v, SdpaOptions::default().block_mask(Arc::new(pattern.block_mask(L, L).unwrap())));
    case.check(&result, false);
    case.check_grads(&result, &dout);
}

#[test]
fn missing_foreign_and_bad_parameters_are_refused_naming_the_flag() {
    let q = f32_tensor(&[1, 1, 100, 4], 51);
    let cases: [(&[&str], &[&str]); 12] = [
        (&["--pattern", "longformer", "--window", "4,4"], &["--global", "longformer", "needs it"]),
        (&["--pattern", "bigbird", "--global", "2", "--random", "1"], &["--window", "bigbird", "needs it"]),
        (&["--pattern", "strided"], &["--stride", "needs it"]),
        (&["--pattern", "fixed", "--stride", "8"], &["--summary", "needs it"]),
        (&["--pattern", "strided", "--stride", "4", "--global", "2"], &["--global", "strided", "does not take it"]),
        (&["--pattern", "sinks", "--sink-tokens", "2", "--window", "8,8"], &["--window", "LEFT,0"]),
        (&["--pattern", "document", "--doc-lengths", "60,30"], &["--doc-lengths", "sum to 90", "100"]),
        (&["--pattern", "strided", "--stride", "0"], &["--stride", "at least 1"]),
        (&["--pattern", "fixed", "--stride", "8", "--summary", "9"], &["--summary", "9"]),
        (&["--pattern", "diagonal"], &["--pattern", "diagonal", "longformer"]),
        (&["--global", "2"], &["--pattern"]),
        (&["--random", "2", "--seed", "1"], &["--pattern"]),
    ];
    for (flags, wanted) in cases {
        let e = fails_on(&[("q", &q), ("k", &q), ("v", &q)], flags);
        for w in wanted {
            assert!(e.contains(w), "{flags:?}: {w:?} not in {e}");
        }
    }
    // Packed sequences take no pattern.
    let packed = f32_tensor(&[10, 1, 4], 52);
    let cu = tensor(&[3], HostData::I64(vec![0, 4, 10]));
    let e = fails_on(
        &[("q", &packed), ("k", &packed), ("v", &packed), ("cu_seqlens_q", &cu), ("cu_seqlens_k", &cu)],
        &["--pattern", "prefix-lm", "--prefix", "2"],
    );
    assert!(e.contains("--pattern prefix-lm") && e.contains("packed sequences") && e.contains("in.safetensors"), "{e}");
    // --seed serves dropout or bigbird's random blocks: alone it is refused.
    let e = fails_on(&[("q", &q), ("k", &q), ("v", &q)], &["--seed", "3"]);
    assert!(e.contains("--dropout") && e.contains("--random"), "{e}");
}
