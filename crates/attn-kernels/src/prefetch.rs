//! Cache prefetch hints shared by the kernels: [`lines`] asks the CPU to bring every cache line of
//! a slice into a chosen level ahead of its use. A hint changes no result; off x86-64 it does
//! nothing. The flash forward asks for a sparse job's query rows in [`L1`] (read once, transposed
//! right after); linear attention's chunk loops ask for the next chunk's rows in [`L2`] (read a
//! chunk later, between other products), except on Intel CPUs, where that measured slower
//! (`linear::chunk`). While a [`Spread`] lives (linear attention's backward jobs), those rows are
//! queued instead and the products' micro-kernels ask for one line per step ([`one`]).

use std::cell::UnsafeCell;

/// Into the L1 cache (x86's `_MM_HINT_T0`).
pub(crate) const L1: i32 = 3;
/// Into the L2 cache (x86's `_MM_HINT_T1`).
pub(crate) const L2: i32 = 2;

/// Prefetches the cache lines overlapping `row` into `LEVEL` ([`L1`] or [`L2`]).
#[inline(always)]
pub(crate) fn lines<const LEVEL: i32, T>(row: &[T]) {
    line_addresses(row).for_each(line::<LEVEL>);
}

/// The addresses of the cache lines overlapping `row`.
#[inline(always)]
fn line_addresses<T>(row: &[T]) -> impl Iterator<Item = usize> {
    let p = row.as_ptr() as usize;
    let skew = p % LINE;
    (0..std::mem::size_of_val(row) + skew).step_by(LINE).map(move |off| p - skew + off)
}

/// Bytes per cache line.
const LINE: usize = 64;

/// Prefetches the cache line at `addr` into `LEVEL`.
#[inline(always)]
fn line<const LEVEL: i32>(addr: usize) {
    // SAFETY: SSE is part of x86-64; a prefetch never faults, whatever the address.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<LEVEL>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Most lines [`Spread`] holds not yet asked for; past it [`later`] asks at once.
const QUEUED: usize = 4096;

/// This thread's queued lines: `lines[at..]` not yet asked for; `spreads`, the [`Spread`]s alive.
struct Queue {
    lines: Vec<usize>,
    at: usize,
    spreads: usize,
}

thread_local! {
    static QUEUE: UnsafeCell<Queue> = const { UnsafeCell::new(Queue { lines: Vec::new(), at: 0, spreads: 0 }) };
}

/// `f` on this thread's queue.
#[inline(always)]
fn with_queue<R>(f: impl FnOnce(&mut Queue) -> R) -> R {
    // SAFETY: the queue is this thread's own, and no function given here calls `with_queue`
    // again, so this is the only reference to it while `f` runs.
    QUEUE.with(|q| f(unsafe { &mut *q.get() }))
}

/// While it lives, [`later`] on this thread queues its lines and the products' micro-kernels
/// ask for them one per step ([`one`]), rather than [`lines`] asking for a row's lines at once.
/// A burst of a chunk's rows (a few hundred lines) fills the CPU's miss buffers, and every
/// prefetch after the first dozen then waits for one to free: on an AMD Zen 5 those waits held
/// ~13% of linear attention's backward samples, and spreading the same lines over the products'
/// steps made the causal forward + backward 1.07× faster. The forward keeps its bursts (it
/// has fewer product steps per chunk to spread them over, and measured 1–10% slower spread).
pub(crate) struct Spread(());

impl Spread {
    /// Queues this thread's [`later`] lines until dropped.
    pub(crate) fn start() -> Self {
        with_queue(|q| q.spreads += 1);
        Spread(())
    }
}

impl Drop for Spread {
    fn drop(&mut self) {
        with_queue(|q| {
            q.spreads -= 1;
            if q.spreads == 0 {
                q.lines.clear();
                q.at = 0;
            }
        });
    }
}

/// The lines of `row` into the [`L2`] cache ahead of its use: queued while a [`Spread`] lives
/// on this thread (at once when [`QUEUED`] lines already wait), else asked for at once.
#[inline(always)]
pub(crate) fn later<T>(row: &[T]) {
    let queued = with_queue(|q| {
        if q.spreads == 0 || q.lines.len() - q.at >= QUEUED {
            return false;
        }
        if q.at == q.lines.len() {
            q.lines.clear();
            q.at = 0;
        }
        q.lines.extend(line_addresses(row));
        true
    });
    if !queued {
        lines::<L2, T>(row);
    }
}

/// Asks for the oldest queued line, if any (one step of a product's loop).
#[inline(always)]
pub(crate) fn one() {
    with_queue(|q| {
        if let Some(&addr) = q.lines.get(q.at) {
            q.at += 1;
            line::<L2>(addr);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines queued on this thread and not yet asked for.
    fn pending() -> usize {
        with_queue(|q| q.lines.len() - q.at)
    }

    #[test]
    fn a_spread_queues_lines_until_the_steps_ask_for_them() {
        let row = vec![0.0f32; 64]; // 256 bytes: 4 lines, or 5 when not line-aligned.
        let lines = line_addresses(&row).count();
        assert!((4..=5).contains(&lines));
        later(&row);
        assert_eq!(pending(), 0, "without a spread, lines are asked for at once");
        {
            let _outer = Spread::start();
            later(&row);
            later(&row[16..]);
            assert_eq!(pending(), lines + line_addresses(&row[16..]).count());
            {
                let _inner = Spread::start();
                one();
            }
            assert_eq!(
                pending(),
                lines + line_addresses(&row[16..]).count() - 1,
                "an inner spread's end keeps the outer's lines"
            );
            while pending() > 0 {
                one();
            }
            one();
            assert_eq!(pending(), 0);
            let big = vec![0.0f32; (QUEUED + 8) * LINE / 4];
            later(&big);
            later(&row);
            assert_eq!(pending(), line_addresses(&big).count(), "past QUEUED lines, a row is asked for at once");
        }
        assert_eq!(pending(), 0, "the last spread's end drops what is queued");
        later(&row);
        assert_eq!(pending(), 0);
    }
}
