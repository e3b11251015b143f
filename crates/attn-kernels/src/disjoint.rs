//! [`Disjoint`]: one output buffer that parallel jobs write at places no two of them share (the
//! flash backward's gradients, the delta rule's output rows of each head).

use std::marker::PhantomData;

/// A buffer that several jobs write at disjoint places.
pub(crate) struct Disjoint<'a> {
    ptr: *mut f32,
    len: usize,
    _life: PhantomData<&'a mut [f32]>,
}

// SAFETY: `Disjoint` only hands out slices through `part`, whose contract makes concurrent
// accesses disjoint; the underlying buffer outlives it ('a).
unsafe impl Send for Disjoint<'_> {}
// SAFETY: as above.
unsafe impl Sync for Disjoint<'_> {}

impl<'a> Disjoint<'a> {
    pub(crate) fn new(buf: &'a mut [f32]) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len(), _life: PhantomData }
    }

    /// Elements `at..at + len`.
    ///
    /// # Safety
    /// No other live slice from this buffer overlaps the range while the result is used.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, at: usize, len: usize) -> &mut [f32] {
        assert!(at + len <= self.len, "disjoint part {at}+{len} beyond {}", self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}
