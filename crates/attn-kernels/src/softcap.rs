//! Soft-capping `cap·tanh(s/cap)` of a row of scores with its derivative `1 − tanh²`, in vectors:
//! [`softcap_row`] inside the kernels (rows padded to whole vectors, the instruction set the
//! kernel runs), and [`softcap_any`] for rows of any length on the best instruction set of this
//! CPU, which the [`Softcap`](crate::score_mod::Softcap) score modification calls so that it
//! computes, element for element, what the built-in soft-cap computes.

use crate::simd::{tanh, Simd, SimdJob, Target};

/// `row[c] = cap · tanh(row[c] / cap)` in place, and with `dcap`, `dcap[c] = 1 − tanh²` there.
///
/// # Safety
/// The CPU supports `S`'s instruction set, and `row.len()` is a multiple of `S::W`.
#[inline(always)]
pub(crate) unsafe fn softcap_row<S: Simd>(row: &mut [f32], cap: f32, dcap: Option<&mut [f32]>) {
    // SAFETY: the CPU supports `S` (the caller's contract); the loop reads and writes whole
    // vectors inside `row`, whose length is a multiple of `S::W`.
    unsafe {
        let c = S::splat(cap);
        for i in (0..row.len()).step_by(S::W) {
            let p = row.as_mut_ptr().add(i);
            S::store(p, S::mul(c, tanh::<S>(S::div(S::load(p), c))));
        }
    }
    if let Some(dc) = dcap {
        derivative(row, cap, dc);
    }
}

/// `dcap[c] = 1 − (row[c] / cap)²` from the capped scores `row`.
#[inline(always)]
fn derivative(row: &[f32], cap: f32, dcap: &mut [f32]) {
    for (d, &x) in dcap.iter_mut().zip(row.iter()) {
        let t = x / cap;
        *d = 1.0 - t * t;
    }
}

/// [`softcap_row`] on a row of any length (the tail through a padded copy), on the best
/// instruction set of this CPU.
pub(crate) fn softcap_any(row: &mut [f32], cap: f32, dcap: Option<&mut [f32]>) {
    Target::best().run(Padded { row, cap, dcap })
}

/// [`softcap_any`]'s arguments as a job.
struct Padded<'a> {
    row: &'a mut [f32],
    cap: f32,
    dcap: Option<&'a mut [f32]>,
}

impl SimdJob for Padded<'_> {
    type Out = ();

    #[inline(always)]
    unsafe fn run<S: Simd>(self) {
        // SAFETY: forwarded from the caller.
        unsafe { softcap_padded::<S>(self.row, self.cap, self.dcap) }
    }
}

/// # Safety
/// The CPU supports `S`'s instruction set.
#[inline(always)]
unsafe fn softcap_padded<S: Simd>(row: &mut [f32], cap: f32, dcap: Option<&mut [f32]>) {
    let whole = row.len() / S::W * S::W;
    let (head, tail) = row.split_at_mut(whole);
    // SAFETY: the CPU supports `S`; `head` is whole vectors.
    unsafe { softcap_row::<S>(head, cap, None) };
    if !tail.is_empty() {
        let mut pad = [0.0f32; 16];
        pad[..tail.len()].copy_from_slice(tail);
        // SAFETY: as above; `pad[..S::W]` is one vector (`S::W <= 16`).
        unsafe { softcap_row::<S>(&mut pad[..S::W], cap, None) };
        tail.copy_from_slice(&pad[..tail.len()]);
    }
    if let Some(d) = dcap {
        derivative(row, cap, d);
    }
}
