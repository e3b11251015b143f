//! Tests of [`gemm`](super::gemm): every part, layout and size against a plain loop.

use super::*;

/// `0.5 + A·B` in f64, `A(i, p) = a[i·row + p·col]`.
fn naive(m: usize, n: usize, k: usize, a: &[f64], row: usize, col: usize, b: &[f64]) -> Vec<f64> {
    let mut o = vec![0.5; m * n];
    for i in 0..m {
        for c in 0..n {
            o[i * n + c] += (0..k).map(|p| a[i * row + p * col] * b[p * n + c]).sum::<f64>();
        }
    }
    o
}

/// `A` (`m × k`) with the zeros `part` promises.
fn operand(m: usize, k: usize, part: Part) -> Vec<f64> {
    let v = |i: usize, p: usize| ((i * k + p) as f64 * 0.37).sin();
    let keep = |i: usize, p: usize| match part {
        Part::LowerA => p <= i,
        Part::UpperA => p >= i,
        Part::Full | Part::LowerOut => true,
    };
    (0..m * k).map(|x| if keep(x / k, x % k) { v(x / k, x % k) } else { 0.0 }).collect()
}

/// The largest error of `gemm` in `T` over the entries `part` asks for, against [`naive`];
/// with `write`, of `O = A·B` over an `O` that held NaN.
fn error<T: Real>(isa: Isa, (m, n, k): (usize, usize, usize), part: Part, transposed: bool, write: bool) -> f64 {
    let a = operand(m, k, part);
    let b: Vec<f64> = (0..k * n).map(|x| (x as f64 * 0.11).cos()).collect();
    // The operand as stored: row-major `[m, k]`, or its transpose `[k, m]`.
    let stored: Vec<f64> = if transposed { (0..k * m).map(|x| a[(x % m) * k + x / m]).collect() } else { a.clone() };
    let cast = |x: &[f64]| x.iter().map(|&v| T::from_f64(v).unwrap()).collect::<Vec<T>>();
    let (st, bt) = (cast(&stored), cast(&b));
    let lhs = if transposed { Lhs::transposed(&st, m) } else { Lhs::rows(&st, k) };
    let (init, base) = if write { (f64::NAN, 0.5) } else { (0.5, 0.0) };
    let mut o = vec![T::from_f64(init).unwrap(); m * n];
    gemm(isa, m, n, k, lhs.part(part).write(write), &bt, n, &mut o, n);
    let want = naive(m, n, k, &a, k, 1, &b);
    let wanted = |x: usize| part != Part::LowerOut || x % n <= x / n;
    // NaN propagates through `max`'s comparison as "not larger": count it as infinite.
    let err = |x: usize| (o[x].to_f64().unwrap() - (want[x] - base)).abs();
    (0..m * n).filter(|&x| wanted(x)).map(|x| if err(x).is_nan() { f64::INFINITY } else { err(x) }).fold(0.0, f64::max)
}

/// Every case of [`SIZES`] × [`PARTS`], `A` stored both ways, added and written.
fn cases() -> impl Iterator<Item = ((usize, usize, usize), Part, bool, bool)> {
    let stored = |s, w| PARTS.map(|p| (s, p, false, w)).into_iter().chain(PARTS.map(|p| (s, p, true, w)));
    SIZES.iter().flat_map(move |&s| stored(s, false).chain(stored(s, true)))
}

#[test]
fn a_written_product_over_no_products_clears_the_output() {
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
        let mut o = vec![f32::NAN; 12];
        gemm(isa, 3, 4, 0, Lhs::rows(&[], 1).write(true), &[], 4, &mut o, 4);
        assert_eq!(o, vec![0.0; 12], "{isa:?}");
    }
}

const SIZES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (5, 33, 7),
    (8, 64, 64),
    (9, 65, 3),
    (4, 31, 2),
    (6, 40, 600),
    (64, 64, 64),
    (13, 17, 13),
    (3, 80, 5),
    // More rows and products than a pass (`KB`): upper-triangular rows from 256 on first meet
    // a product in the second pass, and those beyond `k` none.
    (300, 20, 290),
];
const PARTS: [Part; 4] = [Part::Full, Part::LowerA, Part::UpperA, Part::LowerOut];

#[test]
fn every_isa_layout_and_part_matches_the_naive_product_in_f64() {
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
        for (size, part, t, w) in cases() {
            let err = error::<f64>(isa, size, part, t, w);
            assert!(err < 1e-12, "{isa:?} {size:?} {part:?} transposed {t} written {w}: {err}");
        }
    }
}

#[test]
fn the_f32_micro_kernel_matches_the_naive_product() {
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
        for (size, part, t, w) in cases() {
            // f32 sums of `k` terms of magnitude ≤ 1.
            let err = error::<f32>(isa, size, part, t, w);
            assert!(err < 4e-7 * (size.2 as f64 + 1.0), "{isa:?} {size:?} {part:?} transposed {t} written {w}: {err}");
        }
    }
}
