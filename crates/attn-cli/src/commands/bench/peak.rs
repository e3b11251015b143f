//! The machine's `f32` FMA peak: a short loop of independent fused multiply-adds on one core and
//! on every thread at once, so benchmark results can be stated as a fraction of what the cores
//! can do. The loop uses the instructions of the kernel being benchmarked: AVX2 when
//! `flash-avx2` is forced (on an AVX-512 CPU its share of peak is then of AVX2's), otherwise the
//! widest of AVX-512 and AVX2 detected at run time; with `--compute bf16`, on a CPU whose AMX tiles
//! are ready (`attn_kernels::amx::status`) four independent `TDPBF16PS` tile products, else on a
//! CPU with AVX512-BF16 `VDPBF16PS` (two bfloat16 products per f32 lane): the peak of the bf16
//! products the forward runs. Other CPUs report the peak as unknown.

use std::time::Instant;

use attn_kernels::{amx, Isa, Kernel, Precision};

/// Measured `f32` FMA peak.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// Instruction set of the loop: `"avx512"`, `"avx512-bf16"`, `"amx-bf16"` or `"avx2"`.
    pub isa: &'static str,
    /// GFLOP/s of one thread.
    pub single_gflops: f64,
    /// GFLOP/s of `threads` threads together.
    pub all_gflops: f64,
    /// Threads of the all-core run.
    pub threads: usize,
}

/// Independent accumulators: enough to cover FMA latency times the FMA ports of current cores.
const ACC: usize = 12;

/// Shortest timed run in seconds, so timer resolution and start-up costs do not matter.
const MIN_SECONDS: f64 = 0.05;

#[derive(Debug, Clone, Copy)]
enum FmaIsa {
    Avx512,
    Avx512Bf16,
    AmxBf16,
    Avx2,
}

impl FmaIsa {
    fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Some(FmaIsa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return Some(FmaIsa::Avx2);
            }
        }
        None
    }

    fn name(self) -> &'static str {
        match self {
            FmaIsa::Avx512 => "avx512",
            FmaIsa::Avx512Bf16 => "avx512-bf16",
            FmaIsa::AmxBf16 => "amx-bf16",
            FmaIsa::Avx2 => "avx2",
        }
    }

    /// FLOPs of one loop iteration: every accumulator does one FMA (2 FLOPs per lane), or one
    /// `VDPBF16PS` (two products and two sums per lane); for the tiles, `amx::SPIN_FLOPS`.
    fn flops_per_iter(self) -> f64 {
        let lanes = match self {
            FmaIsa::Avx512 => 16,
            FmaIsa::Avx512Bf16 => 32,
            FmaIsa::AmxBf16 => return attn_kernels::amx::SPIN_FLOPS,
            FmaIsa::Avx2 => 8,
        };
        (ACC * lanes * 2) as f64
    }

    /// Runs `iters` iterations; returns a value depending on every FMA so none is removed.
    fn run(self, iters: u64) -> f32 {
        let iters = std::hint::black_box(iters);
        match self {
            // SAFETY: `detect` returned Avx512 only after checking that the CPU has AVX-512F.
            #[cfg(target_arch = "x86_64")]
            FmaIsa::Avx512 => unsafe { fma_avx512(iters) },
            // SAFETY: `measure` picks Avx512Bf16 only after `Isa::has_avx512_bf16`.
            #[cfg(target_arch = "x86_64")]
            FmaIsa::Avx512Bf16 => unsafe { dot_avx512_bf16(iters) },
            // `measure` picks the tiles only when they are ready; `spin` checks again.
            FmaIsa::AmxBf16 => f32::from(u8::from(attn_kernels::amx::spin(iters))),
            // SAFETY: `detect` returned Avx2 only after checking that the CPU has AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            FmaIsa::Avx2 => unsafe { fma_avx2(iters) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("no FMA loop is detected on this architecture"),
        }
    }

    /// Seconds for `threads` threads to run `iters` iterations each, all started together.
    fn time(self, iters: u64, threads: usize) -> f64 {
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(move || std::hint::black_box(self.run(iters)));
            }
        });
        start.elapsed().as_secs_f64()
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn fma_avx512(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-6));
    let mut acc = [_mm512_setzero_ps(); ACC];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn dot_avx512_bf16(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (
        _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5), _mm512_set1_ps(0.25)),
        _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-6), _mm512_set1_ps(-1e-6)),
    );
    let mut acc = [_mm512_setzero_ps(); ACC];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_avx2(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-6));
    let mut acc = [_mm256_setzero_ps(); ACC];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32, exactly one unaligned 256-bit store.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc.iter().fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x))) };
    lanes.iter().sum()
}

/// Measures the FMA peak of the instructions `kernel` runs on with products in `compute` (see
/// the module header), on one thread and on `threads` threads; `None` when this CPU has neither
/// AVX-512F nor AVX2+FMA. Takes well under a second.
pub fn measure(threads: usize, kernel: Kernel, compute: Precision) -> Option<Peak> {
    let isa = match kernel.resolve() {
        // `resolve` refuses a flash kernel whose instructions this CPU lacks.
        Ok(Kernel::Flash(Isa::Avx2)) => FmaIsa::Avx2,
        Ok(Kernel::Flash(Isa::Avx512)) if compute == Precision::Bf16 && amx::status() == amx::Status::Ready => {
            FmaIsa::AmxBf16
        }
        Ok(Kernel::Flash(Isa::Avx512)) if compute == Precision::Bf16 && Isa::has_avx512_bf16() => FmaIsa::Avx512Bf16,
        _ => FmaIsa::detect()?,
    };
    let mut iters = 1u64 << 14;
    while isa.time(iters, 1) < MIN_SECONDS {
        iters *= 2;
    }
    let best = |threads: usize| (0..3).map(|_| isa.time(iters, threads)).fold(f64::INFINITY, f64::min);
    let flops = iters as f64 * isa.flops_per_iter();
    let single_gflops = flops / best(1) / 1e9;
    let all_gflops = flops * threads as f64 / best(threads) / 1e9;
    Some(Peak { isa: isa.name(), single_gflops, all_gflops, threads })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_positive_when_known() {
        if let Some(p) = measure(2, Kernel::Auto, Precision::F32) {
            assert!(p.single_gflops > 0.0 && p.all_gflops > 0.0, "{p:?}");
            assert_eq!(p.threads, 2);
        }
    }

    #[test]
    fn peak_follows_the_forced_instruction_set() {
        let best = FmaIsa::detect().map(FmaIsa::name);
        assert_eq!(measure(1, Kernel::Reference, Precision::F32).map(|p| p.isa), best);
        if Isa::Avx2.is_available() {
            assert_eq!(measure(1, Kernel::Flash(Isa::Avx2), Precision::Bf16).map(|p| p.isa), Some("avx2"));
        }
        if Isa::Avx512.is_available() {
            assert_eq!(measure(1, Kernel::Flash(Isa::Avx512), Precision::F32).map(|p| p.isa), Some("avx512"));
            let bf16 = if amx::status() == amx::Status::Ready {
                "amx-bf16"
            } else if Isa::has_avx512_bf16() {
                "avx512-bf16"
            } else {
                "avx512"
            };
            assert_eq!(measure(1, Kernel::Auto, Precision::Bf16).map(|p| p.isa), Some(bf16));
        }
    }
}
