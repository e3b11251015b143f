//! A process-wide cache of packing buffers, so that repeated calls (every layer of every step of
//! a model) reuse memory the operating system has already mapped instead of faulting in fresh
//! pages for each call. At most [`KEPT`] buffers are kept, each at most `PACK_BUDGET` bytes.
//! The panels start on a cache line ([`Lines`]): the micro-kernels load them a vector at a time.

use std::sync::Mutex;

use crate::alloc::AllocError;
use crate::lines::Lines;

/// Buffers kept between calls.
const KEPT: usize = 2;

static FREE: Mutex<Vec<Lines<f32>>> = Mutex::new(Vec::new());

/// A buffer of the floats of `shape` (contents unspecified but initialised), or the error for
/// packed keys of that shape.
pub fn take(shape: &[usize]) -> Result<Lines<f32>, AllocError> {
    let mut v = FREE.lock().map(|mut f| f.pop()).ok().flatten().unwrap_or_default();
    v.try_resize("packed keys", shape, 0.0)?;
    Ok(v)
}

/// Returns a buffer to the cache (dropped if the cache is full).
pub fn give(v: Lines<f32>) {
    if let Ok(mut f) = FREE.lock() {
        if f.len() < KEPT {
            f.push(v);
        }
    }
}
