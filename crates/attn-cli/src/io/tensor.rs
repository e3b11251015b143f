//! The in-memory tensor both file formats read into and write from: a shape and a typed,
//! contiguous, row-major element vector, with the element-type table and the little-endian byte
//! codec the formats share. Element vectors and their copies are allocated fallibly (a tensor too
//! large for memory is an error naming its size), and writing streams the bytes in blocks
//! instead of holding a second copy of the tensor.

use std::io::{self, Write};

use attn::alloc::{self, Elem};
use half::{bf16, f16};

use super::error::IoErrorKind;

/// Elements encoded per block when writing.
const BLOCK: usize = 1 << 14;

/// The float element types, for messages.
pub(super) const FLOATS: &str = "F16, BF16, F32 or F64";
/// The boolean element types (U8 non-zero = true), for messages.
pub(super) const BOOLEANS: &str = "BOOL or U8";

/// Element types the readers accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// Single precision.
    F32,
    /// Double precision.
    F64,
    /// Boolean stored as one byte, 0 or 1.
    Bool,
    /// Unsigned byte.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every accepted type.
    pub const ALL: [DType; 8] =
        [DType::F16, DType::Bf16, DType::F32, DType::F64, DType::Bool, DType::U8, DType::I32, DType::I64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// The safetensors name (`"F32"`, `"BOOL"`, ...), also used in messages.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "F16",
            DType::Bf16 => "BF16",
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I32 => "I32",
            DType::I64 => "I64",
        }
    }

    /// The type with safetensors name `name`, if accepted.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The accepted safetensors names, comma separated, for messages.
    pub fn names() -> String {
        DType::ALL.map(DType::name).join(", ")
    }
}

/// Elements of a tensor, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// IEEE half precision.
    F16(Vec<f16>),
    /// bfloat16.
    Bf16(Vec<bf16>),
    /// Single precision.
    F32(Vec<f32>),
    /// Double precision.
    F64(Vec<f64>),
    /// Booleans.
    Bool(Vec<bool>),
    /// Unsigned bytes.
    U8(Vec<u8>),
    /// Signed 32-bit integers.
    I32(Vec<i32>),
    /// Signed 64-bit integers.
    I64(Vec<i64>),
}

impl HostData {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F16(_) => DType::F16,
            HostData::Bf16(_) => DType::Bf16,
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::Bool(_) => DType::Bool,
            HostData::U8(_) => DType::U8,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F16(v) => v.len(),
            HostData::Bf16(v) => v.len(),
            HostData::F32(v) => v.len(),
            HostData::F64(v) => v.len(),
            HostData::Bool(v) => v.len(),
            HostData::U8(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decodes little-endian `bytes` whose length is a multiple of `dtype.size()`. Boolean bytes
    /// must be 0 or 1.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<HostData, IoErrorKind> {
        fn decode<T: Elem, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Result<Vec<T>, IoErrorKind> {
            let values = bytes.chunks_exact(N).map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            });
            Ok(alloc::collect("tensor data", &[bytes.len() / N], values)?)
        }
        Ok(match dtype {
            DType::F16 => HostData::F16(decode(bytes, f16::from_le_bytes)?),
            DType::Bf16 => HostData::Bf16(decode(bytes, bf16::from_le_bytes)?),
            DType::F32 => HostData::F32(decode(bytes, f32::from_le_bytes)?),
            DType::F64 => HostData::F64(decode(bytes, f64::from_le_bytes)?),
            DType::I32 => HostData::I32(decode(bytes, i32::from_le_bytes)?),
            DType::I64 => HostData::I64(decode(bytes, i64::from_le_bytes)?),
            DType::U8 => HostData::U8(decode(bytes, u8::from_le_bytes)?),
            DType::Bool => {
                if let Some(at) = bytes.iter().position(|&b| b > 1) {
                    return Err(IoErrorKind::Value(format!(
                        "boolean element {at} is stored as byte {}, expected 0 or 1",
                        bytes[at]
                    )));
                }
                HostData::Bool(decode(bytes, |[b]| b == 1)?)
            }
        })
    }

    /// Writes the elements to `w` as little-endian bytes (booleans as 0 or 1), a block at a time.
    pub fn write_le(&self, w: &mut dyn Write) -> io::Result<()> {
        fn put<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N], w: &mut dyn Write) -> io::Result<()> {
            let mut buf = Vec::with_capacity(BLOCK * N);
            for block in v.chunks(BLOCK) {
                buf.clear();
                buf.extend(block.iter().flat_map(|&x| f(x)));
                w.write_all(&buf)?;
            }
            Ok(())
        }
        match self {
            HostData::F16(v) => put(v, f16::to_le_bytes, w),
            HostData::Bf16(v) => put(v, bf16::to_le_bytes, w),
            HostData::F32(v) => put(v, f32::to_le_bytes, w),
            HostData::F64(v) => put(v, f64::to_le_bytes, w),
            HostData::I32(v) => put(v, i32::to_le_bytes, w),
            HostData::I64(v) => put(v, i64::to_le_bytes, w),
            HostData::U8(v) => w.write_all(v),
            HostData::Bool(v) => put(v, |b| [u8::from(b)], w),
        }
    }

    /// The elements as little-endian bytes (booleans as 0 or 1), as [`write_le`](Self::write_le)
    /// writes them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.write_le(&mut bytes).expect("writing to memory does not fail");
        bytes
    }
}

/// A tensor in memory: `shape` (any rank, 0 for a scalar) and `data` with `numel()` elements.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: HostData,
}

impl HostTensor {
    /// A tensor of `shape` holding `data`; the element count must equal the shape's product.
    pub fn new(shape: Vec<usize>, data: HostData) -> Result<Self, IoErrorKind> {
        let numel = checked_numel(&shape)?;
        if numel != data.len() {
            return Err(IoErrorKind::Value(format!(
                "{} elements for shape {:?}, expected {}",
                data.len(),
                shape,
                numel
            )));
        }
        Ok(Self { shape, data })
    }

    /// The element type's safetensors name (`"F32"`, `"BOOL"`, ...).
    pub fn dtype_name(&self) -> &'static str {
        self.data.dtype().name()
    }

    /// Number of elements (the product of the shape).
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The elements converted to `f32` (a new vector, allocated fallibly); only floating-point
    /// tensors.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, IoErrorKind> {
        let copy = |values: &mut dyn Iterator<Item = f32>| Ok(alloc::collect("tensor as f32", &self.shape, values)?);
        match &self.data {
            HostData::F16(v) => copy(&mut v.iter().map(|x| x.to_f32())),
            HostData::Bf16(v) => copy(&mut v.iter().map(|x| x.to_f32())),
            HostData::F32(v) => copy(&mut v.iter().copied()),
            HostData::F64(v) => copy(&mut v.iter().map(|&x| x as f32)),
            _ => Err(self.wrong_dtype(FLOATS)),
        }
    }

    /// The elements as booleans (a new vector, allocated fallibly); BOOL tensors, or U8 with
    /// non-zero meaning `true`.
    pub fn to_bool_vec(&self) -> Result<Vec<bool>, IoErrorKind> {
        let copy = |values: &mut dyn Iterator<Item = bool>| Ok(alloc::collect("tensor as bool", &self.shape, values)?);
        match &self.data {
            HostData::Bool(v) => copy(&mut v.iter().copied()),
            HostData::U8(v) => copy(&mut v.iter().map(|&x| x != 0)),
            _ => Err(self.wrong_dtype(BOOLEANS)),
        }
    }

    /// The elements as sizes; I32 or I64 tensors with no negative element.
    pub fn to_usize_vec(&self) -> Result<Vec<usize>, IoErrorKind> {
        let signed: Vec<i64> = match &self.data {
            HostData::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            HostData::I64(v) => v.clone(),
            _ => return Err(self.wrong_dtype("I32 or I64")),
        };
        signed
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                usize::try_from(x).map_err(|_| IoErrorKind::Value(format!("element {i} is {x}, expected >= 0")))
            })
            .collect()
    }

    fn wrong_dtype(&self, expected: &str) -> IoErrorKind {
        IoErrorKind::Dtype { found: self.dtype_name().into(), expected: expected.into() }
    }
}

/// The product of `shape`, or [`IoErrorKind::ShapeOverflow`].
pub fn checked_numel(shape: &[usize]) -> Result<usize, IoErrorKind> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| IoErrorKind::ShapeOverflow { shape: shape.to_vec() })
}

/// The byte size of `shape` elements of `dtype`, or [`IoErrorKind::ShapeOverflow`].
pub fn checked_bytes(shape: &[usize], dtype: DType) -> Result<usize, IoErrorKind> {
    checked_numel(shape)?.checked_mul(dtype.size()).ok_or_else(|| IoErrorKind::ShapeOverflow { shape: shape.to_vec() })
}
