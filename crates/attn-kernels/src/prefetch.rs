//! Cache prefetch hints shared by the kernels: [`lines`] asks the CPU to bring every cache line of
//! a slice into a chosen level ahead of its use. A hint changes no result; off x86-64 it does
//! nothing. The flash forward asks for a sparse job's query rows in [`L1`] (read once, transposed
//! right after); linear attention's chunk loops ask for the next chunk's rows in [`L2`] (read a
//! chunk later, between other products), except on Intel CPUs, where that measured slower
//! (`linear::chunk`).

/// Into the L1 cache (x86's `_MM_HINT_T0`).
pub(crate) const L1: i32 = 3;
/// Into the L2 cache (x86's `_MM_HINT_T1`).
pub(crate) const L2: i32 = 2;

/// Prefetches the cache lines overlapping `row` into `LEVEL` ([`L1`] or [`L2`]).
#[inline(always)]
pub(crate) fn lines<const LEVEL: i32, T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = row.as_ptr().cast::<u8>();
        let skew = p as usize % 64;
        for off in (0..std::mem::size_of_val(row) + skew).step_by(64) {
            // SAFETY: SSE is part of x86-64; a prefetch never faults, and the lines asked for
            // overlap `row`.
            unsafe { std::arch::x86_64::_mm_prefetch::<LEVEL>(p.wrapping_sub(skew).wrapping_add(off).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}
