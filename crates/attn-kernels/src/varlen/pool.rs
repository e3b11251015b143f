//! Buffers kept from sequence to sequence and from call to call: a packed call gathers every
//! sequence into per-sequence buffers, and buffers made afresh for each (rayon's `map_init` makes
//! one per split of the work, not one per thread) fault in new pages each time, which measured
//! several times the cost of the copies themselves. A [`Pool`] keeps at most [`KEPT`] of them,
//! each holding at most [`KEPT_BYTES`], and hands them out under a lock taken once per sequence.

use std::sync::Mutex;

use crate::lines::Lines;

/// Buffers kept between uses.
pub(super) const KEPT: usize = 4;
/// Most bytes one kept buffer holds; larger ones are dropped when given back.
pub(super) const KEPT_BYTES: usize = 64 << 20;

/// Something a [`Pool`] keeps: it knows the bytes it holds.
pub(super) trait Held: Default {
    /// Bytes held (capacity).
    fn held(&self) -> usize;
}

/// A process-wide cache of buffers of type `T`.
pub(super) struct Pool<T>(Mutex<Vec<T>>);

impl<T: Held> Pool<T> {
    /// An empty pool.
    pub(super) const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    /// A kept buffer, or a new empty one.
    pub(super) fn take(&self) -> T {
        self.0.lock().map(|mut f| f.pop()).ok().flatten().unwrap_or_default()
    }

    /// Keeps `buf` for a later [`take`](Pool::take) unless the pool is full or `buf` holds more
    /// than [`KEPT_BYTES`].
    pub(super) fn give(&self, buf: T) {
        if buf.held() > KEPT_BYTES {
            return;
        }
        if let Ok(mut f) = self.0.lock() {
            if f.len() < KEPT {
                f.push(buf);
            }
        }
    }
}

impl<T> Held for Vec<T> {
    fn held(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

impl<T: Copy + Default> Held for Lines<T> {
    fn held(&self) -> usize {
        self.held_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_kept_buffers_of_at_most_kept_bytes() {
        let pool: Pool<Vec<f32>> = Pool::new();
        assert!(pool.take().is_empty(), "an empty pool hands out a new buffer");
        for n in 0..KEPT + 2 {
            pool.give(Vec::with_capacity(16 + n));
        }
        let kept: Vec<_> = (0..KEPT + 2).map(|_| pool.take().capacity()).collect();
        assert_eq!(kept.iter().filter(|&&c| c >= 16).count(), KEPT, "kept {kept:?}");
        pool.give(Vec::with_capacity(KEPT_BYTES / 4 + 1));
        assert_eq!(pool.take().capacity(), 0, "a buffer above KEPT_BYTES is dropped");
    }
}
