//! The portable implementation of [`Simd`]: eight lanes as a plain `[f32; 8]`, each operation a
//! loop LLVM vectorises as far as the baseline target allows. Runs on any CPU; the entry point
//! picks it when neither x86 instruction set is available (or when asked to).

use half::{bf16, f16};

use super::{KvElem, Simd};

/// Plain Rust lanes; LLVM vectorises what it can for the baseline target.
#[derive(Clone, Copy)]
pub struct Portable;

// Each method's contract is the trait's `# Safety` section; of it, this implementation relies only
// on the pointer arguments being valid (it runs on any CPU).
impl Simd for Portable {
    const W: usize = 8;
    const QK_ROWS: usize = 6;
    const PV_ROWS: usize = 6;
    const PV_VECTORS: usize = 2;
    const FMA: bool = false;
    type V = [f32; 8];
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 floats.
        unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const f16) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 halves.
        let h = unsafe { std::ptr::read_unaligned(p as *const [f16; 8]) };
        h.map(f16::to_f32)
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 bfloat16 values.
        let h = unsafe { std::ptr::read_unaligned(p as *const [bf16; 8]) };
        h.map(bf16::to_f32)
    }
    #[inline(always)]
    unsafe fn load_i8(p: *const i8) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 bytes.
        unsafe { std::ptr::read_unaligned(p as *const [i8; 8]) }.map(f32::from)
    }
    #[inline(always)]
    unsafe fn load_fp8(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees `p` is valid for 8 bytes.
        unsafe { std::ptr::read_unaligned(p as *const [u8; 8]) }.map(crate::paged::fp8_decode)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees `p` is valid for 8 floats.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], v) }
    }
    /// Multiply-add with one rounding to f32 of the f64 result (the product of two f32 is exact in
    /// f64), so the result is the fused one but for rare double roundings: as accurate as the FMA
    /// of the x86 paths (the backward's `Δ = dO·O` inherits the forward's rounding of `O`, and two
    /// roundings per product there failed the gradient rule on two golden fixtures), and it
    /// vectorises, where `f32::mul_add` is a library call per lane on CPUs without FMA.
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| (a[i] as f64 * b[i] as f64 + c[i] as f64) as f32)
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn fnma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| (c[i] as f64 - a[i] as f64 * b[i] as f64) as f32)
    }
    #[inline(always)]
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] / b[i])
    }
    #[inline(always)]
    unsafe fn select_lt(a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] < b[i] { x[i] } else { y[i] })
    }
    #[inline(always)]
    unsafe fn select_bits(bits: u32, x: Self::V, y: Self::V) -> Self::V {
        std::array::from_fn(|i| if bits >> i & 1 != 0 { x[i] } else { y[i] })
    }
    #[inline(always)]
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] > b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| if a[i] < b[i] { a[i] } else { b[i] })
    }
    #[inline(always)]
    unsafe fn round(a: Self::V) -> Self::V {
        a.map(f32::round_ties_even)
    }
    #[inline(always)]
    unsafe fn pow2i(n: Self::V) -> Self::V {
        n.map(|n| f32::from_bits((((n as i32) + 127) as u32) << 23))
    }
    #[inline(always)]
    unsafe fn reduce_max(v: Self::V) -> f32 {
        v.into_iter().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    unsafe fn bf16_halves(v: Self::V) -> (Self::V, Self::V) {
        (v.map(|x| f32::from_bits(x.to_bits() << 16)), v.map(|x| f32::from_bits(x.to_bits() & 0xFFFF_0000)))
    }
    #[inline(always)]
    unsafe fn pack_bf16(lo: Self::V, hi: Self::V) -> Self::V {
        let bits = |x: f32| u32::from(x.bf16_bits());
        std::array::from_fn(|i| f32::from_bits(bits(lo[i]) | bits(hi[i]) << 16))
    }
    #[inline(always)]
    unsafe fn reduce_sum(v: Self::V) -> f32 {
        let s: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
        (s[0] + s[2]) + (s[1] + s[3])
    }
}
