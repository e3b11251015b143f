//! The one way into an instruction set. Work written once over [`Simd`] is a [`SimdJob`]; a
//! [`Target`] (an available [`Isa`], and whether AVX-512's bfloat16 products run as `VDPBF16PS`)
//! runs it through one function per instruction set that carries the set's `#[target_feature]`,
//! so that everything the job inlines is compiled for it. Code that is not generic over `Simd`
//! but should still be compiled per instruction set (loops the compiler vectorises) goes through
//! [`on_isa`]. Outside this layer no function carries `#[target_feature]`.

#[cfg(target_arch = "x86_64")]
use super::{Avx2, Avx512, Avx512Bf16};
use super::{Isa, Portable, Simd};

/// Work written once over [`Simd`], run on one instruction set by [`Target::run`]. Its `run` must
/// be `#[inline(always)]` (one the compiler keeps as a function of its own is compiled for the
/// baseline instruction set, with all it inlines).
pub trait SimdJob: Sized {
    /// What the job returns.
    type Out;
    /// Whether the job is compiled for [`Portable`] (those of f16/bf16 keys and values are not:
    /// they reach the portable kernel widened to f32). [`Target::run`] panics on a portable
    /// target for a job without it.
    const ON_PORTABLE: bool = true;
    /// Whether the job is compiled for [`Avx2`] (one written for 16 lanes is not); [`Target::run`]
    /// panics on an AVX2 target for a job without it.
    const ON_AVX2: bool = true;
    /// Whether the job is compiled for [`Avx512Bf16`] as well as plain AVX-512 (the flash kernel's
    /// bfloat16 products); without it a bfloat16 target runs the job on plain AVX-512.
    const ON_AVX512_BF16: bool = false;

    /// Runs the job with `S`'s vectors.
    ///
    /// # Safety
    /// The CPU has `S`'s instruction set.
    unsafe fn run<S: Simd>(self) -> Self::Out;
}

/// An instruction set this CPU has, and whether its bfloat16 products run as AVX512-BF16's
/// `VDPBF16PS` (on AVX-512 only; elsewhere they are emulated with FMAs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    isa: Isa,
    native_bf16: bool,
}

impl Target {
    /// `isa`, its bfloat16 products (if any) emulated with FMAs until [`Target::bf16_products`].
    ///
    /// # Panics
    /// When this CPU lacks `isa` (callers check [`Isa::is_available`] first).
    pub fn new(isa: Isa) -> Target {
        assert!(isa.is_available(), "{isa:?} entered on a CPU without it");
        Target { isa, native_bf16: false }
    }

    /// The fastest instruction set this CPU has ([`Isa::best`]).
    pub fn best() -> Target {
        Target { isa: Isa::best(), native_bf16: false }
    }

    /// With `bf16` (the call's products are bfloat16 pairs), AVX-512 multiplies them with
    /// `VDPBF16PS` where the CPU has AVX512-BF16.
    pub fn bf16_products(self, bf16: bool) -> Target {
        Target { native_bf16: bf16 && self.isa == Isa::Avx512 && Isa::has_avx512_bf16(), ..self }
    }

    /// Lanes of its vectors ([`Simd::W`]).
    pub fn lanes(self) -> usize {
        struct Lanes;
        impl SimdJob for Lanes {
            type Out = usize;
            #[inline(always)]
            unsafe fn run<S: Simd>(self) -> usize {
                S::W
            }
        }
        self.run(Lanes)
    }

    /// `job` run on this instruction set.
    #[inline]
    pub fn run<J: SimdJob>(self, job: J) -> J::Out {
        match self.isa {
            // SAFETY: a `Target` is only made for an instruction set this CPU has (`Target::new`),
            // and with `native_bf16` only where it has AVX512-BF16.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if J::ON_AVX512_BF16 && self.native_bf16 => unsafe { avx512_bf16(job) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512(job) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 if J::ON_AVX2 => unsafe { avx2(job) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unreachable!("a job without an AVX2 copy run on the AVX2 target"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => unreachable!("x86 instruction sets are never available here"),
            // A branch on the constant, so that only the jobs compiled for it have a portable copy.
            Isa::Portable => {
                if J::ON_PORTABLE {
                    // SAFETY: portable code runs on any CPU.
                    unsafe { job.run::<Portable>() }
                } else {
                    unreachable!("a job without a portable copy run on the portable target")
                }
            }
        }
    }
}

/// `f()` compiled for `isa` (its vector width and fused multiply-adds, for the loops the compiler
/// vectorises). Give `f` as an `#[inline(always)]` closure: one the compiler keeps as a function
/// of its own is compiled for the baseline instruction set.
///
/// # Panics
/// When this CPU lacks `isa`.
#[inline(always)]
pub fn on_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    struct Compiled<F>(F);
    impl<R, F: FnOnce() -> R> SimdJob for Compiled<F> {
        type Out = R;
        #[inline(always)]
        unsafe fn run<S: Simd>(self) -> R {
            (self.0)()
        }
    }
    Target::new(isa).run(Compiled(f))
}

/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<J: SimdJob>(job: J) -> J::Out {
    // SAFETY: forwarded from the caller.
    unsafe { job.run::<Avx512>() }
}

/// # Safety
/// The CPU supports AVX-512F and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn avx512_bf16<J: SimdJob>(job: J) -> J::Out {
    // SAFETY: forwarded from the caller.
    unsafe { job.run::<Avx512Bf16>() }
}

/// # Safety
/// The CPU supports AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<J: SimdJob>(job: J) -> J::Out {
    // SAFETY: forwarded from the caller.
    unsafe { job.run::<Avx2>() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_target_runs_its_own_vectors() {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
            let want = if isa == Isa::Avx512 { 16 } else { 8 };
            assert_eq!(Target::new(isa).lanes(), want, "{isa:?}");
            assert_eq!(Target::new(isa).bf16_products(true).lanes(), want, "{isa:?}");
            assert_eq!(on_isa(isa, || 3 + 4), 7);
        }
    }

    /// Every byte through `load_i8` and `load_fp8`, `W` lanes at a time.
    struct Bytes;

    impl SimdJob for Bytes {
        type Out = (Vec<f32>, Vec<f32>);
        #[inline(always)]
        unsafe fn run<S: Simd>(self) -> Self::Out {
            let codes: Vec<u8> = (0..=255).collect();
            let (mut ints, mut fp8s) = (vec![0.0f32; 256], vec![0.0f32; 256]);
            for c in (0..256).step_by(S::W) {
                // SAFETY: the CPU has `S` (the caller's contract); `c + W ≤ 256` for every slice.
                unsafe {
                    S::store(ints.as_mut_ptr().add(c), S::load_i8(codes.as_ptr().add(c) as *const i8));
                    S::store(fp8s.as_mut_ptr().add(c), S::load_fp8(codes.as_ptr().add(c)));
                }
            }
            (ints, fp8s)
        }
    }

    #[test]
    fn byte_loads_decode_every_code_as_the_scalar_definitions_do() {
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.is_available()) {
            let (ints, fp8s) = Target::new(isa).run(Bytes);
            for b in 0..=255u8 {
                assert_eq!(ints[b as usize], f32::from(b as i8), "{isa:?} int8 {b:#04x}");
                let want = crate::paged::fp8_decode(b);
                assert_eq!(fp8s[b as usize].to_bits(), want.to_bits(), "{isa:?} fp8 {b:#04x}: {want}");
            }
        }
    }
}
