//! One `#[test]` per kernel: the `kernel_tests!` macro that turns a check `fn(Kernel)` into a test
//! for each kernel, `isa_test!`, which marks the test of one instruction set ignored (with the
//! reason, in the runner's summary) where the machine that ran `cargo test` lacks it (the `cfg`
//! comes from `build.rs`), and [`for_kernel`], which runs a check after [`assert_available`].

use attn_kernels::Kernel;

/// `isa_test!([avx512] ITEM)` / `isa_test!([avx512bf16] ITEM)` / `isa_test!([avx2] ITEM)`: the `#[test]` item `ITEM` of one
/// instruction set, ignored with the reason where this machine lacks it; `isa_test!([] ITEM)`:
/// `ITEM` as it is.
macro_rules! isa_test {
    ([avx512] $item:item) => {
        #[cfg_attr(attn_lacks_avx512, ignore = "this CPU lacks AVX-512F")]
        $item
    };
    ([avx512bf16] $item:item) => {
        #[cfg_attr(attn_lacks_avx512_bf16, ignore = "this CPU lacks AVX-512F with AVX512-BF16")]
        $item
    };
    ([amx] $item:item) => {
        #[cfg_attr(attn_lacks_amx, ignore = "this CPU lacks AMX-TILE with AMX-BF16 (or AVX-512F)")]
        $item
    };
    ([avx2] $item:item) => {
        #[cfg_attr(attn_lacks_avx2, ignore = "this CPU lacks AVX2, FMA or F16C")]
        $item
    };
    ([] $item:item) => {
        $item
    };
}
pub(crate) use isa_test;

/// One `#[test]` per kernel for each `group => check` pair: a module `group` holding the tests
/// `reference`, `auto`, `flash_avx512`, `flash_avx2` and `flash_portable`, each calling
/// `check(kernel)`; those of an instruction set this machine lacks are ignored (`isa_test!`).
macro_rules! kernel_tests {
    ($($group:ident => $check:ident),* $(,)?) => {$(
        mod $group {
            use attn_kernels::{Isa, Kernel};
            #[test]
            fn reference() {
                crate::common::for_kernel(Kernel::Reference, super::$check)
            }
            #[test]
            fn auto() {
                crate::common::for_kernel(Kernel::Auto, super::$check)
            }
            crate::common::isa_test!([avx512] #[test]
            fn flash_avx512() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx512), super::$check)
            });
            crate::common::isa_test!([avx2] #[test]
            fn flash_avx2() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx2), super::$check)
            });
            #[test]
            fn flash_portable() {
                crate::common::for_kernel(Kernel::Flash(Isa::Portable), super::$check)
            }
        }
    )*};
}
pub(crate) use kernel_tests;

/// Runs `check(kernel)` after [`assert_available`].
pub fn for_kernel(kernel: Kernel, check: fn(Kernel)) {
    assert_available(kernel);
    check(kernel);
}

/// Fails when this CPU cannot run `kernel`: its tests are marked ignored on such a CPU, so a test
/// gets here only from a binary built on another machine, or when ignored tests were asked for.
/// Failing, not passing, keeps a test that did not run from reading "ok".
pub fn assert_available(kernel: Kernel) {
    assert!(
        kernel.is_available(),
        "{}: this CPU lacks its instruction set; run `cargo test` on this machine to have its tests ignored",
        kernel.name()
    );
}
