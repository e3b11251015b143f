//! The SIMD layer: the vector operations every kernel is written in, as one trait ([`Simd`]) with
//! three implementations: AVX-512F (16 lanes) and AVX2+FMA+F16C (8 lanes) in `x86`, and a portable
//! one (8 lanes of plain Rust) in `portable`; their register blocking as the trait's constants; the
//! vector functions built on them, written once, in `math` ([`exp`] and [`tanh`], for
//! soft-capping); bfloat16 pairs for the products of [`crate::Precision::Bf16`] (`pack_bf16`,
//! `dot_bf16`: native on AVX512-BF16 through `Avx512Bf16`, emulated with FMAs elsewhere); the
//! storage types of keys and values ([`KvElem`]: f32, f16, bf16), widened to f32 on load; the
//! instruction sets and the one run-time check of which this CPU has ([`Isa`], in `isa`); and the
//! one way in (`entry`: [`SimdJob`], [`Target`], [`on_isa`]). Code written in one instruction
//! set's intrinsics (the transposes of `x86_transpose`) lives here too: outside this layer no
//! function carries `#[target_feature]`. docs/design/simd.md says how to add an instruction set.
//!
//! Every method is `#[inline(always)]` and `unsafe`: the x86 implementations may only run on a CPU
//! with their features, which [`Target::new`] checks before a job instantiated with them is
//! entered (the entry functions carry `#[target_feature]`, so these bodies are compiled with it).
//! Pointer arguments must be valid for `W` elements. Which implementation runs is chosen once per
//! job by its [`Target`], never here.

mod entry;
mod isa;
mod math;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_bf16;
#[cfg(target_arch = "x86_64")]
mod x86_transpose;

use half::{bf16, f16};

pub use entry::{on_isa, SimdJob, Target};
pub use isa::Isa;
pub use math::{exp, tanh};
pub use portable::Portable;
#[cfg(target_arch = "x86_64")]
pub use x86::Avx512Bf16;
#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_transpose::{transpose_blocks8, transpose_rows_streaming};

/// A vector of `W` f32 lanes. Every method may only be called on a CPU with the implementation's
/// instruction set, and pointer arguments must be valid for `W` elements.
pub trait Simd: Copy + Send + Sync + 'static {
    /// Lanes per vector.
    const W: usize;
    /// Query rows per `qk_panel` call (`micro`): 12 × 2 vectors of scores fill AVX-512's 32
    /// registers; 6 × 2 plus the operands fill the 16 of an 8-lane ISA. One of 4, 6 or 12 (the
    /// bounds `with_rows!` instantiates).
    const QK_ROWS: usize;
    /// Rows per `pv` call (`micro`): 6 on every ISA (6 × 4 vectors on AVX-512, 6 × 2 elsewhere).
    const PV_ROWS: usize;
    /// Vectors of output columns per `pv` call: 4 on AVX-512, 2 on 8-lane ISAs (one of the two).
    const PV_VECTORS: usize;
    /// Whether the instruction set fuses multiply-adds, so that scalar `mul_add` in code compiled
    /// for it is one instruction (else a library call).
    const FMA: bool;
    /// The register type.
    type V: Copy;
    /// All lanes `x`.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn splat(x: f32) -> Self::V;
    /// Loads `W` floats (unaligned).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for reading `W` floats.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Loads `W` halves and widens them.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for reading `W` halves.
    unsafe fn load_f16(p: *const f16) -> Self::V;
    /// Loads `W` bfloat16 values and widens them.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for reading `W` bfloat16 values.
    unsafe fn load_bf16(p: *const bf16) -> Self::V;
    /// Loads `W` signed bytes and converts them to f32 (q8_0 codes).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for reading `W` bytes.
    unsafe fn load_i8(p: *const i8) -> Self::V;
    /// Loads `W` fp8 e4m3 codes and decodes them exactly (`crate::paged::fp8_decode`, lane by lane).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for reading `W` bytes.
    unsafe fn load_fp8(p: *const u8) -> Self::V;
    /// Stores `W` floats (unaligned).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set, and `p` is valid for writing `W` floats.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a·b + c`, fused.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a·b`.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `c − a·b`, fused.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn fnma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a / b`.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise `if a < b { x } else { y }` (a NaN comparison takes `y`).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn select_lt(a: Self::V, b: Self::V, x: Self::V, y: Self::V) -> Self::V;
    /// Lane-wise `if bit l of bits is set { x } else { y }` (bits from `W` on are ignored).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn select_bits(bits: u32, x: Self::V, y: Self::V) -> Self::V;
    /// Lane-wise maximum; NaN in `b` is returned as is.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise minimum; NaN in `b` is returned as is.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes rounded to the nearest integer.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn round(a: Self::V) -> Self::V;
    /// `2^n` for lanes holding integers `n` in `[-127, 127]` (`-127` gives 0).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn pow2i(n: Self::V) -> Self::V;
    /// Largest lane (NaN lanes may be ignored).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn reduce_max(v: Self::V) -> f32;
    /// Sum of the lanes.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn reduce_sum(v: Self::V) -> f32;

    /// Each lane's 32 bits read as two bfloat16 values, widened: `(low half, high half)`.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn bf16_halves(v: Self::V) -> (Self::V, Self::V);

    /// Lanes of `lo` and `hi` rounded to bfloat16 (to nearest, ties to even; NaN stays NaN) and
    /// paired in each lane's 32 bits, `lo` in the low half: the operand [`Simd::dot_bf16`] reads.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    unsafe fn pack_bf16(lo: Self::V, hi: Self::V) -> Self::V;

    /// `acc + a.hi·b.hi + a.lo·b.lo` per lane, `a` and `b` holding bfloat16 pairs as
    /// [`Simd::pack_bf16`] makes them: AVX512-BF16's `VDPBF16PS` where an implementation has it,
    /// else (this default) two fused multiply-adds on the widened halves, whose products are exact.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    #[inline(always)]
    unsafe fn dot_bf16(acc: Self::V, a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: forwarded from the caller.
        unsafe { emulated_dot_bf16::<Self>(acc, a, b) }
    }

    /// Sums of the lanes of four vectors.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    #[inline(always)]
    unsafe fn reduce_sum4(v: [Self::V; 4]) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        unsafe { [Self::reduce_sum(v[0]), Self::reduce_sum(v[1]), Self::reduce_sum(v[2]), Self::reduce_sum(v[3])] }
    }

    /// The first `d` values of each of the `n = rows.len()` rows (at most 16) transposed into
    /// slots `ld ≥ n` apart: `out[k·ld + r] = rows[r][k]` for `k < d`, nothing else written; with
    /// `ld = n` a chunk of queries as `qk_panel` reads them, with `ld = 2·W` half of a key panel
    /// (`pack::pack_keys`). This default copies a value at a time; AVX-512 transposes blocks of
    /// 16 × 16 in registers.
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set; every row holds at least `d` values.
    #[inline(always)]
    unsafe fn transpose_rows(rows: &[&[f32]], d: usize, out: &mut [f32], ld: usize) {
        for k in 0..d {
            for (x, q) in out[k * ld..][..rows.len()].iter_mut().zip(rows) {
                *x = q[k];
            }
        }
    }

    /// `p·2^n` for lanes holding integers `n` in `[-127, 127]` (`-127` gives 0).
    ///
    /// # Safety
    /// The CPU has `Self`'s instruction set.
    #[inline(always)]
    unsafe fn ldexp(p: Self::V, n: Self::V) -> Self::V {
        // SAFETY: forwarded from the caller.
        unsafe { Self::mul(p, Self::pow2i(n)) }
    }
}

/// [`Simd::dot_bf16`] with two fused multiply-adds on the widened halves (high pair first, as
/// `VDPBF16PS` adds them); the products of two bfloat16 values are exact in f32.
///
/// # Safety
/// The CPU has `S`'s instruction set.
#[inline(always)]
pub unsafe fn emulated_dot_bf16<S: Simd>(acc: S::V, a: S::V, b: S::V) -> S::V {
    // SAFETY: forwarded from the caller.
    unsafe {
        let ((a0, a1), (b0, b1)) = (S::bf16_halves(a), S::bf16_halves(b));
        S::fma(a0, b0, S::fma(a1, b1, acc))
    }
}

/// Storage types of keys and values, widened to f32 on load.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Loads `S::W` elements as f32.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set, and `p` is valid for reading `S::W` elements.
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    /// Whether the portable flash kernel is compiled for this type: only for `f32` (the
    /// others reach it widened, `dispatch`), which spares the build two copies of a kernel
    /// that runs only where neither x86 instruction set is.
    const ON_PORTABLE: bool = false;
    /// One element as f32.
    fn to_f32(self) -> f32;
    /// One element rounded to bfloat16 (to nearest, ties to even), its bits.
    fn bf16_bits(self) -> u16;
    /// `row` itself when the type is `f32` (so it can be moved without widening), else `None`.
    fn as_f32(row: &[Self]) -> Option<&[f32]> {
        let _ = row;
        None
    }
}

impl KvElem for f32 {
    const ON_PORTABLE: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::load(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    /// `half::bf16::from_f32`'s bits (to nearest, ties to even; a NaN made quiet), without its
    /// branches: the lane rule of `pack_bf16`, so that the scalar paths that round a value at a
    /// time (`Δ`'s dot products, packing, tails) cost a few integer operations.
    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        let i = self.to_bits();
        let rounded = if self.is_nan() { i | 0x0040_0000 } else { i + 0x7FFF + ((i >> 16) & 1) };
        (rounded >> 16) as u16
    }
    #[inline(always)]
    fn as_f32(row: &[f32]) -> Option<&[f32]> {
        Some(row)
    }
}

impl KvElem for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::load_f16(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        self.to_f32().bf16_bits()
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        // SAFETY: forwarded from the caller.
        unsafe { S::load_bf16(p) }
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }
}
