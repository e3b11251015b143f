//! The package's own rayon pool, in which every kernel call runs whole (`install`): the caller's
//! thread hands over one job and sleeps, and the kernels' parallel loops start from a worker, as in
//! the `attn` binary, instead of each loop being injected from outside the pool and waking its
//! workers again. Its size is `RAYON_NUM_THREADS` (else the cores) until `set_num_threads` says.

use std::sync::{Arc, RwLock};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

static POOL: RwLock<Option<Arc<rayon::ThreadPool>>> = RwLock::new(None);

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
    // `0`: rayon's default, `RAYON_NUM_THREADS` or the number of cores.
    Ok(slot.get_or_insert(build(0)?).clone())
}

/// Sets the number of threads attn's kernels run on (a new pool; calls already running finish on
/// the old one). Like `torch.set_num_threads`.
#[pyfunction]
pub(crate) fn set_num_threads(n: usize) -> PyResult<()> {
    if n == 0 {
        return Err(PyValueError::new_err("set_num_threads: n = 0, expected at least 1"));
    }
    let pool = build(n)?;
    *POOL.write().map_err(|_| PyRuntimeError::new_err("attn: thread pool lock poisoned"))? = Some(pool);
    Ok(())
}

/// The number of threads attn's kernels run on.
#[pyfunction]
pub(crate) fn get_num_threads() -> PyResult<usize> {
    Ok(get()?.current_num_threads())
}
