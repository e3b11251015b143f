//! Inputs as DLPack capsules (`torch.utils.dlpack.to_dlpack(t)`, `ndarray.__dlpack__()`), borrowed
//! for the length of one call, never consumed: the capsule keeps its name, so its producer still
//! frees it, and the Python caller holds it (and so the tensor) alive while the call runs. Both the
//! unversioned (`"dltensor"`) and the versioned (`"dltensor_versioned"`, DLPack ≥ 1.0, which can
//! carry read-only NumPy arrays) capsules are read. Only CPU memory, and only the element types the
//! kernels take: `float32`, `float64`, `float16`, `bfloat16` (bfloat16 as itself, DLPack's
//! `kDLBfloat`) and `bool`.

use std::ffi::{c_void, CStr};
use std::marker::PhantomData;

use half::{bf16, f16};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const CPU: i32 = 1;

/// DLPack's `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`: type code, bits per lane, lanes.
#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    /// In elements; null means compact row-major (unversioned capsules only).
    strides: *const i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensorVersioned` up to its tensor (the unversioned `DLManagedTensor` starts
/// with its tensor).
#[repr(C)]
struct DlManagedVersioned {
    version: [u32; 2],
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut c_void)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// An element type the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    F64,
    F16,
    Bf16,
    Bool,
}

impl Dtype {
    fn of(t: DlDataType) -> Option<Self> {
        Some(match (t.code, t.bits, t.lanes) {
            (2, 32, 1) => Dtype::F32,
            (2, 64, 1) => Dtype::F64,
            (2, 16, 1) => Dtype::F16,
            (4, 16, 1) => Dtype::Bf16,
            (6, 8, 1) => Dtype::Bool,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
            Dtype::Bool => "bool",
        }
    }
}

/// A Rust type with the layout of one [`Dtype`].
pub(crate) trait Elem: Copy {
    const DTYPE: Dtype;
}
impl Elem for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Elem for f64 {
    const DTYPE: Dtype = Dtype::F64;
}
impl Elem for f16 {
    const DTYPE: Dtype = Dtype::F16;
}
impl Elem for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl Elem for bool {
    const DTYPE: Dtype = Dtype::Bool;
}

/// A borrowed CPU tensor: its element type, shape and element strides (`None`: compact row-major),
/// and its first element, valid for `'a`.
pub(crate) struct Borrowed<'a> {
    pub name: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    strides: Option<Vec<isize>>,
    data: *const u8,
    _capsule: PhantomData<&'a ()>,
}

impl<'a> Borrowed<'a> {
    /// Reads the DLPack capsule `obj` (`name` in messages).
    pub(crate) fn new(name: &'static str, obj: &'a Bound<'_, PyAny>) -> PyResult<Self> {
        let capsule = obj.cast::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err(format!("{name}: expected a DLPack capsule, found {}", type_name(obj)))
        })?;
        let tensor: *const DlTensor = if capsule.is_valid_checked(Some(LEGACY)) {
            capsule.pointer_checked(Some(LEGACY))?.as_ptr().cast()
        } else if capsule.is_valid_checked(Some(VERSIONED)) {
            let m: *const DlManagedVersioned = capsule.pointer_checked(Some(VERSIONED))?.as_ptr().cast();
            // SAFETY: a valid capsule named "dltensor_versioned" holds a live `DLManagedTensorVersioned`
            // (the DLPack protocol); `addr_of!` reads no memory.
            unsafe { std::ptr::addr_of!((*m).dl_tensor) }
        } else {
            return Err(PyValueError::new_err(format!("{name}: not an unconsumed DLPack capsule")));
        };
        // SAFETY: a valid, unconsumed DLPack capsule points to a live `DLTensor` whose `shape` (and
        // `strides`, when not null) hold `ndim` entries; the capsule (borrowed for `'a`) keeps them
        // alive, and no Python code runs while this function reads them.
        let t = unsafe { &*tensor };
        if t.device.device_type != CPU {
            return Err(PyValueError::new_err(format!(
                "{name}: on DLPack device type {} (id {}); attn runs on the CPU",
                t.device.device_type, t.device.device_id
            )));
        }
        let dtype = Dtype::of(t.dtype).ok_or_else(|| {
            let DlDataType { code, bits, lanes } = t.dtype;
            PyTypeError::new_err(format!(
                "{name}: DLPack type code {code} with {bits} bits × {lanes} is not supported \
                 (float32, float64, float16, bfloat16, bool)"
            ))
        })?;
        let ndim = usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("{name}: ndim {}", t.ndim)))?;
        let read = |p: *const i64| -> &[i64] {
            if ndim == 0 || p.is_null() {
                &[]
            } else {
                // SAFETY: see above: `p` holds `ndim` entries, alive while the capsule is.
                unsafe { std::slice::from_raw_parts(p, ndim) }
            }
        };
        let shape = read(t.shape)
            .iter()
            .map(|&n| usize::try_from(n).map_err(|_| PyValueError::new_err(format!("{name}: negative size {n}"))))
            .collect::<PyResult<Vec<_>>>()?;
        let strides = (!t.strides.is_null()).then(|| read(t.strides).iter().map(|&s| s as isize).collect());
        let data = (t.data as *const u8).wrapping_add(t.byte_offset as usize);
        Ok(Self { name, dtype, shape, strides, data, _capsule: PhantomData })
    }

    /// Refuses another element type than `T`'s.
    fn check<T: Elem>(&self) -> PyResult<()> {
        if self.dtype == T::DTYPE {
            Ok(())
        } else {
            Err(PyTypeError::new_err(format!(
                "{}: dtype {}, expected {}",
                self.name,
                self.dtype.name(),
                T::DTYPE.name()
            )))
        }
    }

    /// Element strides, a size-1 dimension's taken as 0 (it is never stepped over).
    pub(crate) fn strides(&self) -> Vec<isize> {
        let compact = || {
            let mut acc = 1isize;
            let mut s = vec![0isize; self.shape.len()];
            for d in (0..self.shape.len()).rev() {
                s[d] = acc;
                acc = acc.wrapping_mul(self.shape[d] as isize);
            }
            s
        };
        let s = self.strides.clone().unwrap_or_else(compact);
        s.into_iter().zip(&self.shape).map(|(s, &n)| if n == 1 { 0 } else { s }).collect()
    }

    /// The elements from the first to the last one `reach` elements on, as `T`.
    ///
    /// `reach` must be at most the span the shape and strides cover (checked by the callers).
    pub(crate) fn span<T: Elem>(&self, reach: usize) -> PyResult<&'a [T]> {
        self.check::<T>()?;
        if reach == 0 {
            return Ok(&[]);
        }
        if self.data.is_null() || !(self.data as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(PyValueError::new_err(format!(
                "{}: data pointer not aligned for {}",
                self.name,
                self.dtype.name()
            )));
        }
        // SAFETY: the producer guarantees every element `Σ idx_i·stride_i` of a non-empty tensor
        // lies in one live, initialised allocation of elements of its dtype (checked to be `T`'s,
        // and `bool` holds 0 or 1 by DLPack's `kDLBool`), kept alive by the capsule for `'a`; the
        // callers pass `reach` = 1 + the offset of the farthest element under non-negative strides,
        // so the span lies inside it, and the pointer is aligned (checked). The kernels only read it;
        // the caller's other threads must not write the tensor while the call runs (as for any
        // tensor handed to a native kernel).
        Ok(unsafe { std::slice::from_raw_parts(self.data.cast::<T>(), reach) })
    }

    /// The elements of a C-contiguous tensor, as `T` (an empty tensor, which has no layout, is
    /// an empty slice whatever its strides).
    pub(crate) fn contiguous<T: Elem>(&self) -> PyResult<&'a [T]> {
        if self.shape.contains(&0) {
            return self.span(0);
        }
        let strides = self.strides();
        let mut acc = 1usize;
        for d in (0..self.shape.len()).rev() {
            if self.shape[d] > 1 && strides[d] != acc as isize {
                return Err(PyValueError::new_err(format!(
                    "{}: must be C-contiguous (strides {:?} for shape {:?})",
                    self.name, strides, self.shape
                )));
            }
            acc = acc.saturating_mul(self.shape[d]);
        }
        let n = self.shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        self.span(n.ok_or_else(|| PyValueError::new_err(format!("{}: size overflows", self.name)))?)
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map_or_else(|_| "?".into(), |n| n.to_string())
}
