//! Tells the test suites which of the flash kernel's instruction sets the machine running
//! `cargo test` lacks, as `cfg(attn_lacks_avx512)`, `cfg(attn_lacks_avx512_bf16)` (AVX-512F with
//! AVX512-BF16), `cfg(attn_lacks_amx)` (AMX-TILE and AMX-BF16 by CPUID; whether the system grants
//! them is the test's own check) and `cfg(attn_lacks_avx2)`, so that the tests of a missing instruction set are
//! marked ignored, with the reason, in the test runner's own summary instead of passing without
//! running. The check is [`Isa::is_available`]'s, made here when the build is native (host =
//! target, as under `cargo test`); a target other than x86-64 lacks them all; a cross-build to
//! x86-64 assumes nothing, and a test of a missing instruction set then fails rather than passes
//! (see `tests/common/kernels.rs`). `ATTN_TEST_WITHOUT=avx512` (or `avx512_bf16`, `amx`, `avx2`, comma
//! separated) marks an instruction set missing, to see that path on a machine that has it.
//!
//! [`Isa::is_available`]: src/simd/isa.rs

fn main() {
    println!("cargo::rustc-check-cfg=cfg(attn_lacks_avx512)");
    println!("cargo::rustc-check-cfg=cfg(attn_lacks_avx2)");
    println!("cargo::rustc-check-cfg=cfg(attn_lacks_avx512_bf16)");
    println!("cargo::rustc-check-cfg=cfg(attn_lacks_amx)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=ATTN_TEST_WITHOUT");
    let env = |name| std::env::var(name).unwrap_or_default();
    let x86 = env("CARGO_CFG_TARGET_ARCH") == "x86_64";
    let native = env("HOST") == env("TARGET");
    let pretend = env("ATTN_TEST_WITHOUT");
    let isas = [
        ("avx512", host_has_avx512()),
        ("avx512_bf16", host_has_avx512_bf16()),
        ("amx", host_has_amx()),
        ("avx2", host_has_avx2()),
    ];
    for (isa, on_this_cpu) in isas {
        let pretended = pretend.split(',').any(|p| p.trim() == isa);
        if !x86 || (native && !on_this_cpu) || pretended {
            println!("cargo::rustc-cfg=attn_lacks_{isa}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn host_has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(target_arch = "x86_64")]
fn host_has_avx512_bf16() -> bool {
    host_has_avx512() && std::arch::is_x86_feature_detected!("avx512bf16")
}

#[cfg(target_arch = "x86_64")]
fn host_has_amx() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let edx = if __cpuid(0).eax >= 7 { __cpuid_count(7, 0).edx } else { 0 };
    host_has_avx512() && edx & (1 << 24) != 0 && edx & (1 << 22) != 0
}

#[cfg(target_arch = "x86_64")]
fn host_has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has_avx512() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has_avx512_bf16() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has_amx() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn host_has_avx2() -> bool {
    false
}
