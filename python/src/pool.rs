//! The package's own rayon pool, in which every kernel call runs whole (`install`): the caller's
//! thread hands over one job and sleeps, and the kernels' parallel loops start from a worker, as in
//! the `attn` binary, instead of each loop being injected from outside the pool and waking its
//! workers again. Its size is `RAYON_NUM_THREADS` (else the cores) until `set_num_threads` says.
//! A forked child (a `fork` data-loader worker) inherits the pool but none of its threads, so the
//! package forgets the pool in the child (`os.register_at_fork`) and starts a new one there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);
/// The size `set_num_threads` asked for; 0: rayon's default, `RAYON_NUM_THREADS` or the cores.
static THREADS: AtomicUsize = AtomicUsize::new(0);

fn build(threads: usize) -> PyResult<Arc<rayon::ThreadPool>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("attn-{i}"))
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("attn: cannot start its threads ({e})")))?;
    Ok(Arc::new(pool))
}

/// The pool, started at the first call.
pub(crate) fn get() -> PyResult<Arc<rayon::ThreadPool>> {
    if let Some(p) = POOL.read().ok().and_then(|p| p.clone()) {
        return Ok(p);
    }
    let mut slot = POOL.write().map_err(|_| PyRuntimeError::new_err("attn: thread pool lock poisoned"))?;
    if let Some(p) = slot.as_ref() {
        return Ok(p.clone());
    }
    Ok(slot.insert(build(THREADS.load(Ordering::Relaxed))?).clone())
}

/// Sets the number of threads attn's kernels run on (a new pool; calls already running finish on
/// the old one). Like `torch.set_num_threads`.
#[pyfunction]
pub(crate) fn set_num_threads(n: usize) -> PyResult<()> {
    if n == 0 {
        return Err(PyValueError::new_err("set_num_threads: n = 0, expected at least 1"));
    }
    let pool = build(n)?;
    THREADS.store(n, Ordering::Relaxed);
    *POOL.write().map_err(|_| PyRuntimeError::new_err("attn: thread pool lock poisoned"))? = Some(pool);
    Ok(())
}

/// The number of threads attn's kernels run on.
#[pyfunction]
pub(crate) fn get_num_threads() -> PyResult<usize> {
    Ok(get()?.current_num_threads())
}

/// Forgets the pool in a forked child, whose copy has no threads (a call would wait for them for
/// ever); the next call starts a new one, of the size last set. The copy is leaked: dropping it would signal threads
/// that do not exist in this process.
#[pyfunction]
pub(crate) fn forget_after_fork() {
    // Python forks with the GIL held, and the lock is only taken under the GIL, so it is free.
    if let Ok(mut slot) = POOL.write() {
        std::mem::forget(slot.take());
    }
}
