//! A counting global allocator: wraps [`MiMalloc`] and keeps the bytes currently allocated and
//! their high-water mark in atomics, so `attn bench` can report how much memory a call allocated
//! beyond its output. Every binary linking this crate (the `attn` command and its tests) uses it;
//! the cost is two relaxed atomic updates per allocation.
//!
//! mimalloc rather than the system's allocator: glibc's `malloc` gives large buffers and emptied
//! worker heaps back to the kernel and maps new ones for the next call, whose pages fault in and
//! are cleared again; mimalloc keeps freed memory for reuse, so repeated calls keep one steady
//! speed (see docs/performance-log.md, "attn-cli/src/alloc_meter.rs: module doc"). The library
//! crates keep whatever allocator their user's program has.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;
use std::sync::atomic::{AtomicUsize, Ordering};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// [`MiMalloc`] with byte counting.
pub struct CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn grow(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrink(bytes: usize) {
    CURRENT.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every method forwards to `MiMalloc` with the caller's arguments unchanged, so `MiMalloc`'s
// guarantees hold; the counters only observe successful calls.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        let p = unsafe { MiMalloc.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc_zeroed`'s contract.
        let p = unsafe { MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (hence by `MiMalloc`) with `layout`.
        unsafe { MiMalloc.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by `MiMalloc` with `layout`; the caller upholds the rest.
        let p = unsafe { MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

/// Bytes allocated now (through the global allocator, all threads).
pub fn current_bytes() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// The most bytes allocated at once since the last [`reset_peak`] (or program start).
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Lowers the high-water mark to the bytes allocated now and returns that baseline, so that
/// `peak_bytes() - baseline` after some work is the most extra memory it held at once.
pub fn reset_peak() -> usize {
    let now = current_bytes();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// Serialises the unit tests that move the high-water mark: the counters are process-wide and the
/// test harness runs tests on parallel threads, so one test's [`reset_peak`] would otherwise erase
/// another's peak.
#[cfg(test)]
pub(crate) fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_remembers_a_freed_allocation() {
        let _meter = exclusive();
        let base = reset_peak();
        let mut block = vec![1u8; 1 << 20];
        block.reserve_exact(3 << 20);
        std::hint::black_box(&block);
        drop(block);
        // Tests that do not take `exclusive` may free memory meanwhile, lowering the level the
        // 4 MiB block started from: a 1 MiB margin covers them (without the block remembered, the
        // peak would stay near `base`).
        assert!(peak_bytes() >= base + (3 << 20), "peak {} over base {base}", peak_bytes());
    }
}
