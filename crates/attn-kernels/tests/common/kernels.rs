//! One `#[test]` per kernel: the `kernel_tests!` macro that turns a check `fn(Kernel)` into a test
//! for each kernel, and [`for_kernel`], which runs it or reports the skip when this CPU lacks the
//! kernel's instruction set.

use attn_kernels::{Isa, Kernel};

/// One `#[test]` per kernel for each `group => check` pair: a module `group` holding the tests
/// `reference`, `auto`, `flash_avx512`, `flash_avx2` and `flash_portable`, each calling
/// `check(kernel)` (or reporting a skip when the CPU lacks the kernel's instruction set).
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
            #[test]
            fn flash_avx512() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx512), super::$check)
            }
            #[test]
            fn flash_avx2() {
                crate::common::for_kernel(Kernel::Flash(Isa::Avx2), super::$check)
            }
            #[test]
            fn flash_portable() {
                crate::common::for_kernel(Kernel::Flash(Isa::Portable), super::$check)
            }
        }
    )*};
}
pub(crate) use kernel_tests;

/// Runs `check(kernel)`, or prints why it is skipped when this CPU cannot run `kernel`.
pub fn for_kernel(kernel: Kernel, check: fn(Kernel)) {
    if !kernel.is_available() {
        let isa = match kernel {
            Kernel::Flash(Isa::Avx512) => "avx512f",
            Kernel::Flash(Isa::Avx2) => "avx2+fma",
            _ => kernel.name(),
        };
        println!("skipped: CPU lacks {isa}");
        return;
    }
    check(kernel);
}
