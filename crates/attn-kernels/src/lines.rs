//! [`Lines`]: a growable buffer whose elements start on a cache line (64 bytes), for the kernels'
//! working memory (packed keys, score tiles, chunk features and products, a packed call's gathered
//! sequences), which their vector loops read and write 64 bytes at a time.
//!
//! A `Vec<f32>` starts where the allocator puts it: glibc's `malloc` returns 16-byte alignment
//! (and a large buffer, mapped afresh, sits 16 bytes into its page), so an AVX-512 load or store
//! of a row usually straddles two cache lines and costs two. With the kernels' working memory in
//! [`Lines`] that cost is gone; what is left is the outputs' placement, which the caller's
//! allocator decides (see docs/performance-log.md, "attn-kernels/src/lines.rs: module doc").
//!
//! The buffer over-allocates one line's worth of elements and exposes the slice from the first
//! element on a line; it dereferences to `[T]`, and [`Lines::resize`] keeps `Vec::resize`'s
//! meaning (the elements kept keep their values) even when growing moves the memory.

use std::ops::{Deref, DerefMut};

use crate::alloc::{self, AllocError, Elem};

/// Bytes of a cache line, the alignment of a [`Lines`] buffer's first element.
pub const LINE: usize = 64;

/// A buffer of `T` whose first element lies on a cache line; see [the module](self). Not `Clone`:
/// a copy of the vector would keep the offset of a line in other memory.
#[derive(Debug, Default)]
pub struct Lines<T> {
    buf: Vec<T>,
    /// Index in `buf` of the first element.
    start: usize,
    len: usize,
}

impl<T: Copy> Lines<T> {
    /// A buffer of `n` elements, all `value`.
    pub fn filled(n: usize, value: T) -> Self {
        let mut v = Self { buf: Vec::new(), start: 0, len: 0 };
        v.resize(n, value);
        v
    }

    /// Elements past the requested ones that may be needed to reach a line.
    fn pad() -> usize {
        LINE.div_ceil(std::mem::size_of::<T>().max(1))
    }

    /// `n` elements: the first `min(len, n)` keep their values, new ones are `value`.
    pub fn resize(&mut self, n: usize, value: T) {
        let more = (n + Self::pad()).saturating_sub(self.buf.len());
        self.buf.reserve_exact(more);
        self.place(n, value);
    }

    /// `n` elements for a caller that writes every one before reading any: their values are
    /// unspecified (initialised: what earlier use left, or `value` where the buffer never reached).
    /// Shrinking keeps the memory initialised, so a buffer reused for sizes up and down (a packed
    /// call's gathered sequences, one after another) fills only what it never held rather than
    /// every growth ([`Lines::resize`] fills the new elements, as `Vec::resize` does).
    pub fn resize_for_overwrite(&mut self, n: usize, value: T) {
        if !self.within_held(n) {
            self.resize(n, value);
        }
    }

    /// Sets the length to `n` when the memory already held and initialised reaches it; whether it
    /// did.
    fn within_held(&mut self, n: usize) -> bool {
        let fits = self.start + n <= self.buf.len();
        if fits {
            self.len = n;
        }
        fits
    }

    /// [`Lines::resize`] to the elements of `shape`, allocating fallibly: on failure the error
    /// for `what` and the buffer unchanged.
    pub fn try_resize(&mut self, what: &'static str, shape: &[usize], value: T) -> Result<(), AllocError>
    where
        T: Elem,
    {
        let n = alloc::count::<T>(what, shape)?;
        let total = n
            .checked_add(Self::pad())
            .filter(|t| t.checked_mul(std::mem::size_of::<T>()).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| alloc::too_large::<T>(what, shape))?;
        alloc::reserve_total(&mut self.buf, total, what, shape)?;
        self.place(n, value);
        Ok(())
    }

    /// [`Lines::resize_for_overwrite`] to the elements of `shape`, allocating fallibly as
    /// [`Lines::try_resize`] does.
    pub fn try_resize_for_overwrite(&mut self, what: &'static str, shape: &[usize], value: T) -> Result<(), AllocError>
    where
        T: Elem,
    {
        if self.within_held(alloc::count::<T>(what, shape)?) {
            Ok(())
        } else {
            self.try_resize(what, shape, value)
        }
    }

    /// Sets the length to `n` within the reserved memory (`buf`'s capacity holds `n` plus the
    /// padding): moves the kept elements to the first line boundary and fills the new ones
    /// (those `buf` grows by are filled as it grows, not a second time).
    fn place(&mut self, n: usize, value: T) {
        let old = self.start..self.start + self.len.min(n);
        let held = self.buf.len();
        self.buf.resize(n + Self::pad(), value);
        let start = self.buf.as_ptr().align_offset(LINE);
        // `align_offset` may decline (`usize::MAX`); the buffer then works unaligned.
        let start = if start < Self::pad() { start } else { 0 };
        if start != old.start {
            self.buf.copy_within(old.clone(), start);
        }
        let kept = old.len();
        let filled = held.clamp(start + kept, start + n);
        self.buf[start + kept..filled].fill(value);
        (self.start, self.len) = (start, n);
    }

    /// Bytes of memory the buffer holds (its capacity, the padding included).
    pub fn held_bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<T>()
    }

    /// No elements (the memory is kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl<T> Deref for Lines<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl<'a, T> IntoIterator for &'a Lines<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::{Lines, LINE};

    #[test]
    fn starts_on_a_line_and_keeps_values_as_it_grows() {
        let mut v = Lines::filled(3, 1.0f32);
        for (step, n) in [5usize, 1000, 7, 100_000, 0, 40].into_iter().enumerate() {
            let before: Vec<f32> = v.to_vec();
            v.resize(n, step as f32 + 2.0);
            assert_eq!(v.len(), n);
            if n > 0 {
                assert_eq!(v.as_ptr() as usize % LINE, 0, "resize to {n}");
            }
            let kept = before.len().min(n);
            assert_eq!(&v[..kept], &before[..kept], "resize to {n}: kept values");
            assert!(v[kept..].iter().all(|&x| x == step as f32 + 2.0), "resize to {n}: new values");
            v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        }
        v.clear();
        assert!(v.is_empty());
        assert_eq!((&v).into_iter().count(), 0);
    }

    /// Down and up within the memory it held: no move, no fill (the values written before are
    /// still there); past it: on a line, the kept elements kept and the new ones `value`.
    #[test]
    fn resizing_for_overwrite_fills_only_memory_never_held() {
        let mut v = Lines::filled(1000, 1.0f32);
        v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        let at = v.as_ptr();
        v.resize_for_overwrite(10, 9.0);
        assert_eq!(&v[..], &(0..10).map(|i| i as f32).collect::<Vec<_>>()[..]);
        v.resize_for_overwrite(900, 9.0);
        assert_eq!(v.as_ptr(), at, "no move within the memory held");
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32), "no fill within the memory held");
        v.resize_for_overwrite(50_000, 9.0);
        assert_eq!((v.len(), v.as_ptr() as usize % LINE), (50_000, 0));
        assert!(v[..900].iter().enumerate().all(|(i, &x)| x == i as f32));
        assert!(v[1000..].iter().all(|&x| x == 9.0), "memory never held is filled");
    }

    #[test]
    fn fallible_resize_names_the_buffer_and_leaves_it_unchanged() {
        let mut v = Lines::filled(4, 7.0f64);
        let e = v.try_resize("packed keys", &[usize::MAX / 4, 3], 0.0).unwrap_err();
        assert_eq!(e.what, "packed keys");
        assert!(e.too_large);
        assert_eq!(&v[..], &[7.0; 4]);
        v.try_resize("packed keys", &[2, 3], 1.0).unwrap();
        assert_eq!(&v[..], &[7.0, 7.0, 7.0, 7.0, 1.0, 1.0]);
        assert_eq!(v.as_ptr() as usize % LINE, 0);
        // For overwrite: the same refusal, no fill within the memory held, `value` past it.
        let e = v.try_resize_for_overwrite("key states", &[usize::MAX / 4, 3], 0.0).unwrap_err();
        assert_eq!((e.what, e.too_large, v.len()), ("key states", true, 6));
        v.try_resize_for_overwrite("key states", &[2], 5.0).unwrap();
        v.try_resize_for_overwrite("key states", &[5], 5.0).unwrap();
        assert_eq!(&v[..], &[7.0, 7.0, 7.0, 7.0, 1.0]);
        v.try_resize_for_overwrite("key states", &[4000], 5.0).unwrap();
        assert_eq!((&v[..5], v.as_ptr() as usize % LINE), (&[7.0, 7.0, 7.0, 7.0, 1.0][..], 0));
        assert!(v[6..].iter().all(|&x| x == 5.0), "memory never held is filled");
    }
}
