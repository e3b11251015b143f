//! The instruction sets the flash kernel is compiled for ([`Isa`]) and the one run-time check of
//! which of them this CPU has ([`Isa::is_available`]); [`Isa::best`] picks the fastest available,
//! in the order AVX-512F, AVX2+FMA+F16C, portable. Non-x86 targets only ever have the portable one.

/// Instruction sets of the flash kernel's micro-kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F.
    Avx512,
    /// AVX2 with FMA and F16C.
    Avx2,
    /// Plain Rust, any CPU.
    Portable,
}

impl Isa {
    /// Whether this CPU can run the instruction set.
    pub fn is_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => false,
            Isa::Portable => true,
        }
    }

    /// Whether this CPU has AVX512-BF16 beside AVX-512F, so that [`crate::Precision::Bf16`]
    /// products run as `VDPBF16PS` on [`Isa::Avx512`] (else they are emulated in f32).
    pub fn has_avx512_bf16() -> bool {
        #[cfg(target_arch = "x86_64")]
        return Isa::Avx512.is_available() && std::arch::is_x86_feature_detected!("avx512bf16");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The fastest instruction set this CPU supports.
    pub fn best() -> Isa {
        [Isa::Avx512, Isa::Avx2].into_iter().find(|i| i.is_available()).unwrap_or(Isa::Portable)
    }
}
