//! The NumPy `.npy` format, versions 1.0, 2.0 and 3.0: the magic `\x93NUMPY`, a version, a
//! little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0), the header dict, then the raw
//! row-major data. Accepted element types: `<f2 <f4 <f8 |b1 |u1 <i4 <i8`; big-endian, object,
//! structured and Fortran-ordered arrays are refused. Header numbers are checked against the file
//! before anything is allocated from them.
//!
//! The `npyz` crate (0.9.1) does not parse for us because it accepts files that `tests/io_npy.rs`
//! requires refused — `header_unknown_key`, `header_duplicate_key` (its header dict becomes a map)
//! and `data_too_long` (trailing bytes are ignored) — panics on `shape_product_overflows` when
//! overflow checks are on (the product wraps to zero elements when they are off), and allocates a
//! buffer of the header length read from the file before comparing it with the file size
//! (`header_length_beyond_file`).

use std::path::Path;

use super::error::{IoError, IoErrorKind};
use super::file::{read_checked, write_file};
use super::npy_header::parse_header;
use super::tensor::{checked_bytes, DType, HostData, HostTensor};

/// The first bytes of every `.npy` file.
pub(super) const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Magic, version and a 2-byte header length: the shortest possible prefix.
const MIN_PREFIX: usize = 10;
/// `.npy` type codes of the accepted element types.
const DESCRS: [(&str, DType); 7] = [
    ("<f2", DType::F16),
    ("<f4", DType::F32),
    ("<f8", DType::F64),
    ("|b1", DType::Bool),
    ("|u1", DType::U8),
    ("<i4", DType::I32),
    ("<i8", DType::I64),
];

/// Reads the array of the `.npy` file `path`.
pub fn read_npy(path: &Path) -> Result<HostTensor, IoError> {
    let bytes = read_checked(path, MIN_PREFIX as u64, ".npy prefix")?;
    parse_npy(&path.display().to_string(), &bytes)
}

/// Parses the bytes of a whole `.npy` file; `file` names it in errors.
pub fn parse_npy(file: &str, bytes: &[u8]) -> Result<HostTensor, IoError> {
    let fail = |kind| IoError::file(file, kind);
    let file_size = bytes.len() as u64;
    let too_short = |need: usize| IoErrorKind::TooShort { what: ".npy prefix", need: need as u64, found: file_size };
    if bytes.len() < MIN_PREFIX {
        return Err(fail(too_short(MIN_PREFIX)));
    }
    if &bytes[..6] != MAGIC {
        return Err(fail(IoErrorKind::Magic { found: bytes[..6].escape_ascii().to_string() }));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len, prefix) = match (major, minor) {
        (1, 0) => (u64::from(u16::from_le_bytes([bytes[8], bytes[9]])), MIN_PREFIX),
        (2 | 3, 0) => {
            let Some(len) = bytes.get(8..12) else { return Err(fail(too_short(12))) };
            (u64::from(u32::from_le_bytes([len[0], len[1], len[2], len[3]])), 12)
        }
        _ => return Err(fail(IoErrorKind::Version { major, minor })),
    };
    if len > file_size - prefix as u64 {
        return Err(fail(IoErrorKind::HeaderLength { len, file_size }));
    }
    let (header, data) = bytes[prefix..].split_at(len as usize);
    let text = std::str::from_utf8(header).map_err(|e| fail(IoErrorKind::Header(format!("not UTF-8: {e}"))))?;
    let header = parse_header(text).map_err(|e| fail(IoErrorKind::Header(e)))?;
    let dtype = descr_dtype(&header.descr).map_err(fail)?;
    if header.fortran_order {
        return Err(fail(IoErrorKind::Header("fortran_order is True; only C-ordered arrays are supported".into())));
    }
    let expected = checked_bytes(&header.shape, dtype).map_err(fail)?;
    if data.len() != expected {
        return Err(fail(IoErrorKind::DataLength {
            shape: header.shape,
            dtype: dtype.name(),
            expected,
            found: data.len(),
        }));
    }
    let data = HostData::from_le_bytes(dtype, data).map_err(fail)?;
    Ok(HostTensor { shape: header.shape, data })
}

/// Writes `tensor` to the `.npy` file `path` (version 1.0, or 2.0 for headers over 64 KiB), whole
/// or not at all through [`write_file`]; BF16 has no `.npy` type code and is refused.
pub fn write_npy(path: &Path, tensor: &HostTensor) -> Result<(), IoError> {
    let file = path.display().to_string();
    let bytes = npy_bytes(tensor).map_err(|kind| IoError::file(file, kind))?;
    write_file(path, |w| w.write_all(&bytes))
}

/// The bytes of `tensor` as a `.npy` file (version 1.0, or 2.0 for headers over 64 KiB); BF16
/// has no `.npy` type code and is refused.
pub(super) fn npy_bytes(tensor: &HostTensor) -> Result<Vec<u8>, IoErrorKind> {
    let dtype = tensor.data.dtype();
    let descr = DESCRS
        .iter()
        .find(|(_, d)| *d == dtype)
        .map(|(s, _)| *s)
        .ok_or_else(|| IoErrorKind::Dtype { found: dtype.name().into(), expected: descr_list() })?;
    let dims: Vec<String> = tensor.shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut bytes = MAGIC.to_vec();
    let len_bytes = if header.len() + MIN_PREFIX < 65536 - 64 { 2 } else { 4 };
    let prefix = 8 + len_bytes;
    let padded = (prefix + header.len() + 1).next_multiple_of(64) - prefix;
    header.push_str(&" ".repeat(padded - header.len() - 1));
    header.push('\n');
    if len_bytes == 2 {
        bytes.extend([1, 0]);
        bytes.extend((header.len() as u16).to_le_bytes());
    } else {
        bytes.extend([2, 0]);
        bytes.extend((header.len() as u32).to_le_bytes());
    }
    bytes.extend(header.as_bytes());
    tensor.data.write_le(&mut bytes).map_err(|e| IoErrorKind::Write(e.to_string()))?;
    Ok(bytes)
}

fn descr_dtype(descr: &str) -> Result<DType, IoErrorKind> {
    if let Some((_, d)) = DESCRS.iter().find(|(s, _)| *s == descr) {
        return Ok(*d);
    }
    let found = match descr.as_bytes().first() {
        Some(b'>') => format!("'{descr}' (big-endian)"),
        _ if descr.contains('O') => format!("'{descr}' (object array)"),
        _ => format!("'{descr}'"),
    };
    Err(IoErrorKind::Dtype { found, expected: descr_list() })
}

fn descr_list() -> String {
    let codes: Vec<String> = DESCRS.iter().map(|(s, _)| format!("'{s}'")).collect();
    format!("one of {}", codes.join(", "))
}
