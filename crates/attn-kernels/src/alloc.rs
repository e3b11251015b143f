//! Fallible allocation of the buffers whose size comes from a caller's shapes (outputs, weights,
//! gradients, packed keys, copies of inputs): the byte count is computed with overflow checks and
//! the memory reserved with `try_reserve_exact`, so a request too large to hold is an
//! [`AllocError`] naming the buffer, its shape and the bytes asked for, never an aborted process.
//! Small scratch whose size is bounded by a tile, or by the length of an input that already
//! exists, is allocated the ordinary way.

use std::fmt;

/// A buffer that could not be allocated: what it is for, its shape and element type, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocError {
    /// What the buffer holds (`"attention weights"`, `"packed keys"`, ...).
    pub what: &'static str,
    /// Its shape, outermost first.
    pub shape: Vec<usize>,
    /// Its element type (`"f32"`, ...).
    pub dtype: &'static str,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Whether the size exceeded what one allocation may hold (`isize::MAX` bytes, or an
    /// overflowing count) rather than the allocator refusing a legal size.
    pub too_large: bool,
}

impl AllocError {
    /// The bytes asked for (approximate beyond 2^53, and for counts that overflow `usize`).
    pub fn bytes(&self) -> f64 {
        self.shape.iter().map(|&d| d as f64).product::<f64>() * self.elem_bytes as f64
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = if self.too_large { "more than the address space holds" } else { "allocation failed" };
        write!(f, "{} {:?} {} need {}: {why}", self.what, self.shape, self.dtype, human_bytes(self.bytes(), false))
    }
}

impl std::error::Error for AllocError {}

/// Element types with a short name for messages.
pub trait Elem: Clone {
    /// The name in messages (`"f32"`).
    const NAME: &'static str;
}

macro_rules! elem_names {
    ($($t:ty => $name:literal),*) => {$(
        impl Elem for $t {
            const NAME: &'static str = $name;
        }
    )*};
}
elem_names!(f32 => "f32", f64 => "f64", half::f16 => "f16", half::bf16 => "bf16", u8 => "u8", bool => "bool",
            i32 => "i32", i64 => "i64");

/// The error for a buffer `what` of `shape` and element type `T`.
fn error<T: Elem>(what: &'static str, shape: &[usize], too_large: bool) -> AllocError {
    AllocError { what, shape: shape.to_vec(), dtype: T::NAME, elem_bytes: std::mem::size_of::<T>(), too_large }
}

/// The element count of `shape` when a buffer of it may exist (at most `isize::MAX` bytes of
/// `T`), or the error for `what`.
pub fn count<T: Elem>(what: &'static str, shape: &[usize]) -> Result<usize, AllocError> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| n.checked_mul(std::mem::size_of::<T>()).is_some_and(|b| b <= isize::MAX as usize))
        .ok_or_else(|| error::<T>(what, shape, true))
}

/// An empty vector with room for the elements of `shape`, or the error for `what`.
pub fn with_capacity<T: Elem>(what: &'static str, shape: &[usize]) -> Result<Vec<T>, AllocError> {
    let mut v = Vec::new();
    v.try_reserve_exact(count::<T>(what, shape)?).map_err(|_| error::<T>(what, shape, false))?;
    Ok(v)
}

/// Resizes `v` to the elements of `shape`, new elements `value` (a reused buffer keeps its
/// memory), or returns the error for `what` with `v` unchanged.
pub fn resize<T: Elem>(v: &mut Vec<T>, what: &'static str, shape: &[usize], value: T) -> Result<(), AllocError> {
    let n = count::<T>(what, shape)?;
    reserve_total(v, n, what, shape)?;
    v.resize(n, value);
    Ok(())
}

/// Room for `total` elements in `v` (its length unchanged), or the error for a buffer `what` of
/// `shape`; `total` (the shape's count, or more, e.g. with padding) was checked to fit one
/// allocation by the caller.
pub(crate) fn reserve_total<T: Elem>(
    v: &mut Vec<T>,
    total: usize,
    what: &'static str,
    shape: &[usize],
) -> Result<(), AllocError> {
    v.try_reserve_exact(total.saturating_sub(v.len())).map_err(|_| error::<T>(what, shape, false))
}

/// The error for a buffer `what` of `shape` larger than one allocation may hold.
pub(crate) fn too_large<T: Elem>(what: &'static str, shape: &[usize]) -> AllocError {
    error::<T>(what, shape, true)
}

/// A vector of the elements of `shape`, all `value`, or the error for `what`.
pub fn filled<T: Elem>(what: &'static str, shape: &[usize], value: T) -> Result<Vec<T>, AllocError> {
    let mut v = Vec::new();
    resize(&mut v, what, shape, value)?;
    Ok(v)
}

/// Element types whose all-zero bit pattern is the value zero, so that [`zeroed`] may hand out
/// memory the allocator cleared as a vector of them.
///
/// # Safety
/// Every byte 0 must be a valid value of the type.
pub unsafe trait ZeroBits: Elem {}

// SAFETY: all-zero bits are `+0.0` in IEEE 754.
unsafe impl ZeroBits for f32 {}
// SAFETY: as above.
unsafe impl ZeroBits for f64 {}

/// A vector of the elements of `shape`, all zero, or the error for `what`, with no writing pass of
/// its own over the memory: it comes from the allocator's zeroed allocation (`calloc`), which for a
/// large buffer (glibc: above its `mmap` threshold, at most 32 MiB) maps fresh pages that the
/// kernel clears. On Linux a buffer of [`HUGE_PAGES_FROM`] bytes or more is first offered
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`) and then populated on rayon's threads
/// (`populate`), so the kernel clears its pages in bulk up front rather than one fault at a time
/// inside the caller's loops.
pub fn zeroed<T: ZeroBits>(what: &'static str, shape: &[usize]) -> Result<Vec<T>, AllocError> {
    let n = count::<T>(what, shape)?;
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| error::<T>(what, shape, true))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout's size is not zero.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(error::<T>(what, shape, false));
    }
    advise_huge_pages(ptr.cast(), layout.size());
    populate(ptr.cast(), layout.size());
    // SAFETY: `ptr` comes from the global allocator with the layout of `n` elements of `T` (so
    // capacity `n` matches its size and alignment), and its bytes are zero, a valid `T`
    // (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// The size from which [`zeroed`] asks for huge pages: large outputs only (glibc maps
/// buffers this large afresh on rayon's threads, so their pages are new on every call).
pub const HUGE_PAGES_FROM: usize = 8 << 20;

/// Faults in the pages of a fresh buffer of [`HUGE_PAGES_FROM`] bytes or more on all of rayon's
/// threads at once, 2 MiB per request (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14 and later; a
/// kernel that refuses it leaves the pages to fault when first written): the kernel clears them
/// in bulk before the caller's loops run, rather than one fault at a time inside them.
fn populate(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGES_FROM {
        use rayon::prelude::*;
        const PAGE: usize = 4096;
        const PIECE: usize = 2 << 20;
        let start = ptr as usize / PAGE * PAGE;
        let end = (ptr as usize + bytes).next_multiple_of(PAGE);
        (start..end).step_by(PIECE).collect::<Vec<_>>().into_par_iter().for_each(|a| {
            // SAFETY: `a .. a + len` lies within the pages of the allocation of `bytes` bytes at
            // `ptr`, which the caller owns; populating changes no contents (the pages read 0).
            unsafe { libc::madvise(a as *mut libc::c_void, PIECE.min(end - a), libc::MADV_POPULATE_WRITE) };
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// Asks Linux to back the 2 MiB-aligned part of `bytes` bytes from `ptr`, not yet touched, with
/// transparent huge pages (`madvise(MADV_HUGEPAGE)`; a hint, which a kernel without them or set
/// to `never` ignores). Does nothing below [`HUGE_PAGES_FROM`] or off Linux.
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGES_FROM {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: `start .. end` lies within the allocation of `bytes` bytes at `ptr`, which the
            // caller owns; `MADV_HUGEPAGE` changes no contents, only how untouched pages are backed.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

/// The items of `iter` (exactly as many as the elements of `shape`) collected into a vector
/// allocated fallibly, or the error for `what`.
pub fn collect<T: Elem>(
    what: &'static str,
    shape: &[usize],
    iter: impl IntoIterator<Item = T>,
) -> Result<Vec<T>, AllocError> {
    let mut v = with_capacity(what, shape)?;
    let n = v.capacity();
    v.extend(iter.into_iter().take(n));
    Ok(v)
}

/// `bytes` with one decimal in decimal units (`"14.4 GB"`, as memory is sold) or, with `binary`,
/// binary ones (`"1.5 KiB"`); whole bytes below the first step. Used by [`AllocError`]'s message;
/// hidden from the documentation, other crates use it as `attn::alloc::human_bytes`.
#[doc(hidden)]
pub fn human_bytes(bytes: f64, binary: bool) -> String {
    let (step, units) = if binary {
        (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"])
    } else {
        (1000.0, ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"])
    };
    let mut x = bytes;
    let mut unit = 0;
    // Stepping up at `step - 0.05` keeps `999.96` from printing as `1000.0 kB`.
    while x >= step - 0.05 && unit + 1 < units.len() {
        x /= step;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{x:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_decimal_or_binary_units() {
        assert_eq!(human_bytes(0.0, false), "0 B");
        assert_eq!(human_bytes(999.0, false), "999 B");
        assert_eq!(human_bytes(14.4e9, false), "14.4 GB");
        assert_eq!(human_bytes(999_960.0, false), "1.0 MB");
        assert_eq!(human_bytes(2f64.powi(63), false), "9.2 EB");
        assert_eq!(human_bytes(1536.0, true), "1.5 KiB");
        assert_eq!(human_bytes((3u64 << 30) as f64, true), "3.0 GiB");
        assert_eq!(human_bytes(1023.0, true), "1023 B");
    }

    #[test]
    fn legal_sizes_are_allocated_and_filled() {
        let v = filled("x", &[2, 3], 1.5f32).unwrap();
        assert_eq!(v, [1.5; 6]);
        assert_eq!(zeroed::<f32>("x", &[3, 70000]).unwrap(), vec![0.0; 210000]);
        // Large enough for huge pages and the parallel populating: still all zero, all there.
        let big = zeroed::<f64>("x", &[3, 1 << 20]).unwrap();
        assert!(big.len() == 3 << 20 && big.iter().all(|&x| x == 0.0));
        assert!(zeroed::<f64>("x", &[0, 4]).unwrap().is_empty());
        assert!(zeroed::<f64>("x", &[1 << 62, 4]).unwrap_err().too_large);
        assert_eq!(collect("x", &[3], (0..10).map(|i| i as f64)).unwrap(), [0.0, 1.0, 2.0]);
        assert!(filled::<f32>("x", &[0, usize::MAX], 0.0).unwrap().is_empty());
    }

    #[test]
    fn impossible_sizes_are_errors() {
        let e = filled::<f32>("attention weights", &[1, 1, 1 << 31, 1 << 31], 0.0).unwrap_err();
        assert!(e.too_large);
        assert_eq!(
            e.to_string(),
            format!(
                "attention weights [1, 1, {0}, {0}] f32 need 18.4 EB: more than the address space holds",
                1u64 << 31
            )
        );
        let e = with_capacity::<u8>("x", &[usize::MAX, 2]).unwrap_err();
        assert!(e.too_large && e.bytes() > 3e19);
    }

    #[test]
    fn a_refused_legal_size_says_allocation_failed() {
        let e = AllocError {
            what: "attention weights",
            shape: vec![1, 1, 60000, 60000],
            dtype: "f32",
            elem_bytes: 4,
            too_large: false,
        };
        assert_eq!(e.to_string(), "attention weights [1, 1, 60000, 60000] f32 need 14.4 GB: allocation failed");
    }
}
