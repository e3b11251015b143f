//! The AMX tile operations on the CPU ([`Hardware`]), as inline assembly (the tile intrinsics are
//! not stable Rust), and what makes them usable: the CPUID check, Linux's permission for the tile
//! data state, and the tile configuration ([`Configured`]: every tile 16 rows × 64 bytes, loaded
//! per thread and released when dropped).

#[cfg(target_arch = "x86_64")]
use std::arch::asm;

use super::{Tiles, TILE_ROWS, TILE_SLOTS};

/// The CPU's tiles. Every operation needs the tiles configured on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hardware;

/// Whether the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22) and
/// AVX-512F.
pub(super) fn cpu_has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if !std::arch::is_x86_feature_detected!("avx512f") || __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 24) != 0 && edx & (1 << 22) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`);
/// whether it was granted. Other systems: not granted.
pub(super) fn request_permission() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: the request only changes which state this process may use; it reads no memory.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    false
}

/// The tiles configured on this thread (palette 1, eight tiles of 16 rows × 64 bytes) while it
/// lives; dropping it releases them.
pub struct Configured(());

impl Configured {
    /// Configures the tiles on this thread.
    ///
    /// # Safety
    /// [`super::status`] is [`super::Status::Ready`]: the CPU has the tiles and the process may
    /// use them.
    pub unsafe fn new() -> Configured {
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        for t in 0..8 {
            cfg[16 + 2 * t..18 + 2 * t].copy_from_slice(&((TILE_SLOTS * 4) as u16).to_le_bytes());
            cfg[48 + t] = TILE_ROWS as u8;
        }
        // SAFETY: the CPU has AMX and the process its permission (the caller's contract); `cfg`
        // is a valid 64-byte palette-1 configuration.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("ldtilecfg [{c}]", c = in(reg) cfg.as_ptr(), options(nostack, readonly))
        };
        Configured(())
    }
}

impl Drop for Configured {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `new`, so the CPU has them.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("tilerelease", options(nostack, nomem))
        };
    }
}

impl Tiles for Hardware {
    unsafe fn configure(&mut self) -> Option<Configured> {
        // SAFETY: the CPU has the tiles and the process the permission (the caller's contract).
        Some(unsafe { Configured::new() })
    }

    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: the tiles are configured (the caller's contract).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("tilezero tmm{t}", t = const T, options(nostack, nomem))
        };
    }

    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, p: *const f32, stride: usize) {
        // SAFETY: configured; 16 rows of 64 bytes at `stride · 4` bytes are readable (the caller's
        // contract).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) p, s = in(reg) stride * 4,
                options(nostack, readonly))
        };
    }

    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, p: *mut f32, stride: usize) {
        // SAFETY: configured; 16 rows of 64 bytes at `stride · 4` bytes are writable (the caller's
        // contract).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride * 4, options(nostack))
        };
    }

    #[inline(always)]
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: configured (the caller's contract); the instruction reads and writes tiles only.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B, options(nostack, nomem))
        };
    }
}
