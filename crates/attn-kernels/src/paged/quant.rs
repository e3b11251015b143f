//! The quantized cache formats, element by element: llama.cpp's `q8_0` (signed bytes in blocks
//! of [`Q8_BLOCK`] values along `D`, one f16 scale per block: `x ≈ q · d`, `d = amax / 127`) and
//! fp8 e4m3 (OCP's `E4M3FN`: 4 exponent bits of bias 7, 3 mantissa bits, no infinities, largest
//! finite ±448) times a per-head f32 scale, as vLLM's CPU fp8 cache. Encoding rounds to nearest
//! (q8_0 halves away from zero as llama.cpp's `roundf`; e4m3 ties to even) and saturates; decoding
//! is exact in f32, so the kernel and the oracle see the same values.

use half::f16;

/// Values per q8_0 block (and its one scale).
pub const Q8_BLOCK: usize = 32;

/// Largest finite e4m3 magnitude.
pub const FP8_MAX: f32 = 448.0;

/// Quantizes `x` (a multiple of [`Q8_BLOCK`] long) into `q` and one scale per block in `scales`.
/// A block of zeros gets scale 0; non-finite inputs are the caller's to refuse.
pub fn q8_encode(x: &[f32], q: &mut [i8], scales: &mut [f16]) {
    for ((xb, qb), s) in x.chunks(Q8_BLOCK).zip(q.chunks_mut(Q8_BLOCK)).zip(scales.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in qb.iter_mut().zip(xb) {
            *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        *s = f16::from_f32(d);
    }
}

/// `out[i] = q[i] · scales[i / 32]`, exact in f32.
#[inline(always)]
pub fn q8_decode(q: &[i8], scales: &[f16], out: &mut [f32]) {
    for ((qb, ob), s) in q.chunks(Q8_BLOCK).zip(out.chunks_mut(Q8_BLOCK)).zip(scales) {
        let d = s.to_f32();
        for (o, &v) in ob.iter_mut().zip(qb) {
            *o = f32::from(v) * d;
        }
    }
}

/// The e4m3 bits nearest `x` (ties to even), saturating at ±448; NaN encodes as 0.
pub fn fp8_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    let em = if a.is_nan() {
        return 0;
    } else if a >= FP8_MAX {
        0x7E
    } else if a < 2f32.powi(-6) {
        // Subnormals `m · 2⁻⁹`, m in 0..8; m = 8 is the smallest normal's code.
        (a * 512.0).round_ties_even() as u8
    } else {
        let bits = a.to_bits();
        let rounded = bits + 0x7FFFF + ((bits >> 20) & 1);
        let e = (rounded >> 23) - 120;
        (((e << 3) | ((rounded >> 20) & 7)) as u8).min(0x7E)
    };
    sign | em
}

/// The value of e4m3 bits `b` (0x7F and 0xFF, e4m3's NaN, never come from [`fp8_encode`] and
/// read as 480), exact in f32. Branch-free, so a loop of it vectorises.
#[inline(always)]
pub fn fp8_decode(b: u8) -> f32 {
    let em = u32::from(b & 0x7F);
    let normal = f32::from_bits((em << 20) + (120 << 23));
    let sub = em as f32 * (1.0 / 512.0);
    let mag = if em < 8 { sub } else { normal };
    f32::from_bits(mag.to_bits() | (u32::from(b & 0x80) << 24))
}

/// `out[i] = fp8_decode(q[i]) · scale`.
#[inline(always)]
pub fn fp8_decode_row(q: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(q) {
        *o = fp8_decode(b) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fp8_code_decodes_to_its_e4m3_value_and_encodes_back() {
        for b in 0u8..=255 {
            if b & 0x7F == 0x7F {
                continue;
            }
            let (e, m) = (i32::from((b >> 3) & 15), f32::from(b & 7));
            let mag = if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) };
            let want = if b & 0x80 != 0 { -mag } else { mag };
            assert_eq!(fp8_decode(b), want, "code {b:#04x}");
            assert_eq!(fp8_encode(want), if want == 0.0 && b == 0x80 { 0x80 } else { b }, "value {want}");
        }
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates() {
        let codes: Vec<f32> = (0u8..0x7F).map(fp8_decode).collect();
        for i in 0..20_000 {
            let x = (i as f32 * 0.0371).powf(1.7) * 1e-3;
            let got = fp8_decode(fp8_encode(x));
            let best = codes.iter().fold(f32::INFINITY, |b, &c| if (c - x).abs() < (b - x).abs() { c } else { b });
            assert_eq!((got - x).abs(), (best - x).abs(), "{x}: {got} vs nearest {best}");
            assert_eq!(fp8_decode(fp8_encode(-x)), -got);
        }
        assert_eq!(fp8_decode(fp8_encode(1e9)), 448.0);
        assert_eq!(fp8_decode(fp8_encode(-500.0)), -448.0);
        // 1 + 1/16 lies halfway between 1 and 1.125: ties go to the even mantissa (1).
        assert_eq!(fp8_decode(fp8_encode(1.0625)), 1.0);
        assert_eq!(fp8_decode(fp8_encode(1.1875)), 1.25);
    }

    #[test]
    fn q8_blocks_round_within_half_a_step_of_their_own_scale() {
        let x: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) * if i < 32 { 1e-3 } else { 1.0 }).collect();
        let (mut q, mut s, mut back) = (vec![0i8; 96], vec![f16::ZERO; 3], vec![0.0f32; 96]);
        q8_encode(&x, &mut q, &mut s);
        q8_decode(&q, &s, &mut back);
        for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
            let d = s[i / 32].to_f32();
            assert!((a - b).abs() <= 0.5 * d + 1e-3 * a.abs(), "{i}: {a} → {b} (step {d})");
        }
        assert!(q.iter().any(|&v| v.abs() == 127));
        let mut zq = [1i8; 32];
        let mut zs = [f16::ONE];
        q8_encode(&[0.0; 32], &mut zq, &mut zs);
        assert_eq!((zq, zs[0]), ([0; 32], f16::ZERO));
    }
}
