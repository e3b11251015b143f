//! Cache prefetch hints shared by the kernels: [`lines`] asks the CPU to bring every cache line of
//! a slice into a chosen level ahead of its use. A hint changes no result; off x86-64 it does
//! nothing. The flash forward asks for a sparse job's query rows in [`L1`] (read once, transposed
//! right after); linear attention's chunk loops ask for the next chunk's rows in [`L2`] (read a
//! chunk later, between other products; [`later_rows`]), except on Intel CPUs, where that
//! measured slower (`linear::chunk`). While a [`Spread`] lives (linear attention's chunk loops,
//! forward and backward), those rows are queued instead and the products' micro-kernels ask for
//! one line per step ([`one`]).

use std::cell::UnsafeCell;
use std::ops::Range;

/// Into the L1 cache (x86's `_MM_HINT_T0`).
pub(crate) const L1: i32 = 3;
/// Into the L2 cache (x86's `_MM_HINT_T1`).
pub(crate) const L2: i32 = 2;

/// Prefetches the cache lines overlapping `row` into `LEVEL` ([`L1`] or [`L2`]).
#[inline(always)]
pub(crate) fn lines<const LEVEL: i32, T>(row: &[T]) {
    line_addresses(row).for_each(line::<LEVEL>);
}

/// The addresses of the cache lines overlapping `row`, as an iterator of known length (so that a
/// vector extends by them in one reservation and a plain loop).
#[inline(always)]
fn line_addresses<T>(row: &[T]) -> impl Iterator<Item = usize> {
    let p = row.as_ptr() as usize;
    let skew = p % LINE;
    let first = p - skew;
    (0..(std::mem::size_of_val(row) + skew).div_ceil(LINE)).map(move |k| first + k * LINE)
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

/// Most lines [`Spread`] holds not yet asked for; past it [`later_rows`] asks at once.
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

/// `f` on this thread's queue, run in the caller's code (`LocalKey::with` only fetches the
/// queue's address: a closure run inside it, where the compiler kept it out of line, was compiled
/// for the baseline instruction set).
#[inline(always)]
fn with_queue<R>(f: impl FnOnce(&mut Queue) -> R) -> R {
    let q = QUEUE.with(UnsafeCell::get);
    // SAFETY: the queue is this thread's own and lives as long as the thread (the pointer is used
    // on it, now), and no function given here calls `with_queue` again, so this is the only
    // reference to it while `f` runs.
    f(unsafe { &mut *q })
}

/// While it lives, [`later_rows`] on this thread queues its lines and the products' micro-kernels
/// ask for them one per step ([`one`]), rather than [`lines`] asking for a row's lines at once.
/// A burst of a chunk's rows (a few hundred lines) fills the CPU's miss buffers, and every
/// prefetch after the first dozen then waits for one to free; the same lines spread over the
/// products' steps made linear attention faster, backward and forward (see
/// docs/performance-log.md, "attn-kernels/src/prefetch.rs: Spread").
pub(crate) struct Spread(());

impl Spread {
    /// Queues this thread's [`later_rows`] lines until dropped.
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

impl Queue {
    /// Queues the lines of `row`, unless no [`Spread`] lives or [`QUEUED`] lines already wait.
    #[inline(always)]
    fn push<T>(&mut self, row: &[T]) -> bool {
        if self.spreads == 0 || self.lines.len() - self.at >= QUEUED {
            return false;
        }
        if self.at == self.lines.len() {
            self.lines.clear();
            self.at = 0;
        }
        self.lines.extend(line_addresses(row));
        true
    }
}

/// The lines of rows `rows` of `x` (`w` elements each, `ld` apart, cut at the end of `x`; none
/// from the first row that starts past it) into the [`L2`] cache ahead of their use: queued while
/// a [`Spread`] lives on this thread (those past [`QUEUED`] waiting lines asked for at once), else
/// asked for at once. Rows that follow one another (`ld == w`) are one span. The queue is looked
/// up once for all the rows, and each span's lines written into it in one plain loop, far cheaper
/// than pushing them line by line (see docs/performance-log.md,
/// "attn-kernels/src/prefetch.rs: later_rows").
#[inline(always)]
pub(crate) fn later_rows<T>(x: &[T], ld: usize, w: usize, rows: Range<usize>) {
    if rows.is_empty() {
        return;
    }
    if ld == w {
        later_spans(x.get(rows.start * w..(rows.end * w).min(x.len())).into_iter());
    } else {
        later_spans(rows.map_while(|i| x.get(i * ld..(i * ld + w).min(x.len()))));
    }
}

/// [`later_rows`] of the spans `spans`.
#[inline(always)]
fn later_spans<'a, T: 'a>(mut spans: impl Iterator<Item = &'a [T]>) {
    let refused = with_queue(|q| spans.by_ref().find(|s| !q.push(s)));
    refused.into_iter().chain(spans).for_each(lines::<L2, T>);
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

    /// The lines queued on this thread and not yet asked for.
    fn queued() -> Vec<usize> {
        with_queue(|q| q.lines[q.at..].to_vec())
    }

    /// [`later_rows`] of one row.
    fn later(row: &[f32]) {
        later_rows(row, row.len(), row.len(), 0..1);
    }

    #[test]
    fn line_addresses_cover_a_slice() {
        let x = vec![0.0f32; 100];
        for (at, len) in [(0, 0), (0, 1), (3, 16), (5, 64), (1, 99)] {
            let s = &x[at..at + len];
            let (p, bytes) = (s.as_ptr() as usize, len * 4);
            let want: Vec<usize> = (p / LINE * LINE..p + bytes).step_by(LINE).collect();
            assert_eq!(line_addresses(s).collect::<Vec<_>>(), want, "x[{at}..][..{len}]");
        }
    }

    #[test]
    fn later_rows_queues_each_rows_lines_in_order() {
        let x = vec![0.0f32; 40 * 16 + 8];
        let _spread = Spread::start();
        // Strided rows: each row's lines in row order; rows cut at the end of `x`, none past it.
        later_rows(&x, 40, 24, 14..20);
        let rows = [&x[560..584], &x[600..624], &x[640..648]];
        let want: Vec<usize> = rows.iter().flat_map(|r| line_addresses(r)).collect();
        assert_eq!(queued(), want);
        while pending() > 0 {
            one();
        }
        // Rows that follow one another: one span.
        later_rows(&x, 16, 16, 3..7);
        assert_eq!(queued(), line_addresses(&x[48..112]).collect::<Vec<_>>());
        while pending() > 0 {
            one();
        }
        later_rows(&x, 16, 16, 5..5);
        later_rows(&x, 16, 16, 50..60);
        assert_eq!(pending(), 0, "no rows, or rows past the end: no lines");
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
            while pending() > 0 {
                one();
            }
            later_rows(&big, 64, 64, 0..QUEUED / 4 + 1);
            let span = line_addresses(&big[..(QUEUED / 4 + 1) * 64]).count();
            assert!(span > QUEUED);
            assert_eq!(pending(), span, "one span of rows is queued whole");
        }
        assert_eq!(pending(), 0, "the last spread's end drops what is queued");
        later(&row);
        assert_eq!(pending(), 0);
    }
}
