//! NumPy's `.npz` archives (what `np.savez` and `np.savez_compressed` write): a zip archive with
//! one `NAME.npy` member per array, stored or deflated. The zip structure is read by the `zip`
//! crate; each member is parsed by this crate's checked `.npy` reader ([`parse_npy`]).
//!
//! Before anything is decompressed, every member's declared sizes are checked against the
//! archive: a stored member holds exactly its compressed size, a deflated one at most
//! [`MAX_DEFLATE_RATIO`] times it, and the compressed sizes together fit in the archive (so
//! members overlapping the same bytes cannot multiply it). A member then decompresses to exactly
//! its declared size or is refused. Duplicate names, folders, members that are not `NAME.npy`,
//! encrypted members and other compression methods are refused, each naming the member.
//!
//! Writing produces an uncompressed archive, as `np.savez` does.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::path::Path;

use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

use super::error::{IoError, IoErrorKind};
use super::file::{read_checked, write_file};
use super::npy::{npy_bytes, parse_npy};
use super::tensor::HostTensor;

/// Largest output deflate can produce per compressed byte (its best case is about 1032:1).
pub const MAX_DEFLATE_RATIO: u64 = 1032;

/// Reads every array of the `.npz` archive `path`, by name (the member name without `.npy`).
pub fn read_npz(path: &Path) -> Result<BTreeMap<String, HostTensor>, IoError> {
    let bytes = read_checked(path, 0, "zip archive")?;
    parse_npz(&path.display().to_string(), &bytes)
}

/// Parses the bytes of a whole `.npz` archive; `file` names it in errors, and a member's own
/// problems are reported as `FILE member NAME.npy: ...`.
pub fn parse_npz(file: &str, bytes: &[u8]) -> Result<BTreeMap<String, HostTensor>, IoError> {
    let fail = |problem: String| IoError::file(file, IoErrorKind::Archive(problem));
    let mut archive = ZipArchive::new(Cursor::new(bytes)).map_err(|e| fail(format!("not a valid zip archive: {e}")))?;
    if archive.has_duplicate_names() {
        return Err(fail("a member name is listed twice".into()));
    }
    let mut members = Vec::with_capacity(archive.len());
    let mut compressed_total = 0u64;
    for index in 0..archive.len() {
        let entry = archive.by_index_data(index).map_err(|e| fail(format!("member {index}: {e}")))?;
        let name = entry.name().map_err(|e| fail(format!("member {index}: name: {e}")))?.into_owned();
        let member_fail = |problem: String| fail(format!("member '{name}' {problem}"));
        let Some(tensor) = name.strip_suffix(".npy").filter(|t| !t.is_empty() && !entry.is_dir()) else {
            return Err(member_fail("is not an array, expected NAME.npy members only".into()));
        };
        if entry.encrypted() {
            return Err(member_fail("is encrypted".into()));
        }
        let (size, compressed) = (entry.size(), entry.compressed_size());
        let most = match entry.compression() {
            CompressionMethod::Stored => compressed,
            CompressionMethod::Deflated => compressed.saturating_mul(MAX_DEFLATE_RATIO),
            other => {
                return Err(member_fail(format!(
                    "is compressed with {other}, expected stored or deflated (np.savez, np.savez_compressed)"
                )))
            }
        };
        if size > most {
            return Err(member_fail(format!(
                "declares {size} bytes, more than its {compressed} compressed bytes can hold ({most})"
            )));
        }
        compressed_total = compressed_total.saturating_add(compressed);
        if compressed_total > bytes.len() as u64 {
            return Err(fail(format!(
                "members declare {compressed_total} compressed bytes or more, the archive has {}",
                bytes.len()
            )));
        }
        members.push((tensor.to_string(), name.clone(), size));
    }
    let mut tensors = BTreeMap::new();
    for (index, (tensor, name, size)) in members.into_iter().enumerate() {
        let member_fail = |problem: String| fail(format!("member '{name}' {problem}"));
        let mut member = archive.by_index(index).map_err(|e| member_fail(format!("cannot be opened: {e}")))?;
        // Grown as data arrives (never sized from a number in the archive), at most `size + 1`.
        let mut data = Vec::new();
        (&mut member)
            .take(size.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| member_fail(format!("cannot be decompressed: {e}")))?;
        if data.len() as u64 != size {
            let found = if data.len() as u64 > size { "more".to_string() } else { data.len().to_string() };
            return Err(member_fail(format!("decompresses to {found} bytes, declared {size}")));
        }
        let array = parse_npy(&format!("{file} member {name}"), &data)?;
        tensors.insert(tensor, array);
    }
    Ok(tensors)
}

/// The bytes of an uncompressed `.npz` archive holding one `NAME.npy` member per tensor, in order;
/// names must be distinct, and BF16 (no `.npy` type) is refused.
pub fn npz_bytes(file: &str, tensors: &[(&str, &HostTensor)]) -> Result<Vec<u8>, IoError> {
    let fail = |name: &str, problem: String| IoError::tensor(file, name, IoErrorKind::Write(problem));
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, tensor) in tensors {
        let bytes = npy_bytes(tensor).map_err(|kind| IoError::tensor(file, *name, kind))?;
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .large_file(bytes.len() as u64 >= u64::from(u32::MAX));
        zip.start_file(format!("{name}.npy"), options).map_err(|e| fail(name, e.to_string()))?;
        zip.write_all(&bytes).map_err(|e| fail(name, e.to_string()))?;
    }
    let cursor = zip.finish().map_err(|e| IoError::file(file, IoErrorKind::Write(e.to_string())))?;
    Ok(cursor.into_inner())
}

/// Writes `tensors` (name, tensor) to the `.npz` archive `path`, uncompressed as `np.savez` does.
pub fn write_npz(path: &Path, tensors: &[(&str, &HostTensor)]) -> Result<(), IoError> {
    let file = path.display().to_string();
    let bytes = npz_bytes(&file, tensors)?;
    write_file(path, |w| w.write_all(&bytes))
}
