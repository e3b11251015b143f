//! The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
//! names to `{dtype, shape, data_offsets}`, then the data section. Reading is done here with
//! every field checked (each error names the tensor and the expected versus found values) and
//! nothing allocated from a header number before it is checked against the file. Writing makes the
//! header here and streams each tensor's bytes into [`write_file`] (whole or not at all, with a
//! plainly created file's mode): the `safetensors` crate's writers either hold a second copy of
//! every tensor in memory (`serialize`) or create the file with mode 0600 and name their temporary
//! file in errors (`serialize_to_file`).
//!
//! The `safetensors` crate (0.8) does not parse for us because `SafeTensors::deserialize` accepts
//! files that `tests/io_safetensors.rs` requires refused: `name_given_twice` (its header map keeps
//! the last of two equal names) and `unknown_field` (extra entry fields are ignored). Several of
//! its refusals also name neither the tensor nor the numbers, which messages on top could not
//! recover (`shape_product_overflows`, `byte_length_mismatch`, `offsets_beyond_data`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{json, Map, Value};

use super::error::{IoError, IoErrorKind};
use super::file::{read_checked, write_file};
use super::tensor::{checked_bytes, DType, HostData, HostTensor};

/// Bytes of the header-length prefix.
const PREFIX: usize = 8;
/// Largest header accepted (the `safetensors` crate's limit).
pub const MAX_HEADER: u64 = 100_000_000;
/// The fields of a tensor entry in the header.
const FIELDS: [&str; 3] = ["dtype", "shape", "data_offsets"];

/// Reads every tensor of the safetensors file `path`, by name.
pub fn read_safetensors(path: &Path) -> Result<BTreeMap<String, HostTensor>, IoError> {
    let bytes = read_checked(path, PREFIX as u64, "header length prefix")?;
    parse_safetensors(&path.display().to_string(), &bytes)
}

/// Parses the bytes of a whole safetensors file; `file` names it in errors.
pub fn parse_safetensors(file: &str, bytes: &[u8]) -> Result<BTreeMap<String, HostTensor>, IoError> {
    let fail = |kind| IoError::file(file, kind);
    let file_size = bytes.len() as u64;
    let Some(prefix) = bytes.first_chunk::<PREFIX>() else {
        return Err(fail(IoErrorKind::TooShort {
            what: "header length prefix",
            need: PREFIX as u64,
            found: file_size,
        }));
    };
    let len = u64::from_le_bytes(*prefix);
    if len > file_size - PREFIX as u64 {
        return Err(fail(IoErrorKind::HeaderLength { len, file_size }));
    }
    if len > MAX_HEADER {
        return Err(fail(IoErrorKind::HeaderTooLarge { len, max: MAX_HEADER }));
    }
    let (header, data) = bytes[PREFIX..].split_at(len as usize);
    let text = std::str::from_utf8(header).map_err(|e| fail(IoErrorKind::Header(format!("not UTF-8: {e}"))))?;
    let Ok(Entries(pairs)) = serde_json::from_str(text) else {
        // Not a JSON object: parsed again only to say what it is instead.
        let json: Value =
            serde_json::from_str(text).map_err(|e| fail(IoErrorKind::Header(format!("not valid JSON: {e}"))))?;
        return Err(fail(IoErrorKind::Header(format!("{}, expected a JSON object", json_kind(&json)))));
    };
    let mut seen = BTreeSet::new();
    if let Some((name, _)) = pairs.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return Err(IoError::tensor(file, name, IoErrorKind::Header("name given twice in the header".into())));
    }
    let mut entries = Vec::with_capacity(pairs.len());
    for (name, value) in &pairs {
        if name == "__metadata__" {
            check_metadata(value).map_err(fail)?;
        } else {
            entries.push(parse_entry(name, value, data.len()).map_err(|kind| IoError::tensor(file, name, kind))?);
        }
    }
    check_tiling(file, &mut entries, data.len())?;
    entries
        .into_iter()
        .map(|e| {
            let data = HostData::from_le_bytes(e.dtype, &data[e.start..e.end])
                .map_err(|kind| IoError::tensor(file, &e.name, kind))?;
            Ok((e.name, HostTensor { shape: e.shape, data }))
        })
        .collect()
}

/// Writes `tensors` (name, tensor) to the safetensors file `path`, their data in the order given;
/// names must be distinct.
pub fn write_safetensors(path: &Path, tensors: &[(&str, &HostTensor)]) -> Result<(), IoError> {
    let mut header = Map::new();
    let mut offset = 0;
    for (name, t) in tensors {
        let end = offset + t.data.len() * t.data.dtype().size();
        let entry = json!({"dtype": t.dtype_name(), "shape": t.shape, "data_offsets": [offset, end]});
        if header.insert(name.to_string(), entry).is_some() {
            let file = path.display().to_string();
            return Err(IoError::tensor(file, *name, IoErrorKind::Write("name given twice".into())));
        }
        offset = end;
    }
    let mut text = Value::Object(header).to_string();
    // Padded with spaces to a multiple of 8 bytes, so the data starts aligned.
    text.extend(std::iter::repeat_n(' ', text.len().next_multiple_of(8) - text.len()));
    write_file(path, |w| {
        w.write_all(&(text.len() as u64).to_le_bytes())?;
        w.write_all(text.as_bytes())?;
        tensors.iter().try_for_each(|(_, t)| t.data.write_le(w))
    })
}

/// The top-level entries of a header object, in file order. A parsed JSON map keeps only the last
/// of two equal names, so the pairs are kept as they come and a name given twice is found.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, Value>()? {
                    pairs.push(pair);
                }
                Ok(Entries(pairs))
            }
        }
        d.deserialize_map(Pairs)
    }
}

/// One header entry, checked against the data section on its own.
struct Entry {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

fn parse_entry(name: &str, value: &Value, data_len: usize) -> Result<Entry, IoErrorKind> {
    let Value::Object(obj) = value else {
        return Err(IoErrorKind::Header(format!(
            "{}, expected an object with fields dtype, shape and data_offsets",
            json_kind(value)
        )));
    };
    if let Some(extra) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(IoErrorKind::Header(format!("unknown field '{extra}', expected dtype, shape and data_offsets")));
    }
    let dtype_name = match obj.get("dtype") {
        Some(Value::String(s)) => s,
        other => return Err(field_error("dtype", "a string", other)),
    };
    let dtype = DType::from_name(dtype_name).ok_or_else(|| IoErrorKind::Dtype {
        found: dtype_name.clone(),
        expected: format!("one of {}", DType::names()),
    })?;
    let shape = usize_array(obj.get("shape"))
        .ok_or_else(|| field_error("shape", "an array of non-negative integers", obj.get("shape")))?;
    let offsets = usize_array(obj.get("data_offsets"))
        .filter(|o| o.len() == 2)
        .ok_or_else(|| field_error("data_offsets", "an array of two non-negative integers", obj.get("data_offsets")))?;
    let (start, end) = (offsets[0], offsets[1]);
    let expected = checked_bytes(&shape, dtype)?;
    if end < start {
        return Err(IoErrorKind::Offsets(format!("[{start}, {end}] end before they start")));
    }
    if end > data_len {
        return Err(IoErrorKind::Offsets(format!(
            "[{start}, {end}] reach beyond the data section of {data_len} bytes"
        )));
    }
    if end - start != expected {
        return Err(IoErrorKind::DataLength { shape, dtype: dtype.name(), expected, found: end - start });
    }
    Ok(Entry { name: name.to_string(), dtype, shape, start, end })
}

/// Checks the byte ranges tile the data section exactly: sorted, no overlap, no gap, no tail.
fn check_tiling(file: &str, entries: &mut [Entry], data_len: usize) -> Result<(), IoError> {
    entries.sort_by_key(|e| (e.start, e.end));
    let mut pos = 0;
    let mut prev: Option<&str> = None;
    for e in entries.iter() {
        let after = prev.map_or("at the start of the data".to_string(), |p| format!("after tensor '{p}'"));
        let problem = if e.start < pos {
            format!("[{}, {}] overlap tensor '{}', which ends at {pos}", e.start, e.end, prev.unwrap_or_default())
        } else if e.start > pos {
            format!("[{}, {}] leave bytes {pos}..{} unused {after}", e.start, e.end, e.start)
        } else {
            pos = e.end;
            prev = Some(&e.name);
            continue;
        };
        return Err(IoError::tensor(file, &e.name, IoErrorKind::Offsets(problem)));
    }
    if pos != data_len {
        return Err(IoError::file(
            file,
            IoErrorKind::Offsets(format!("cover {pos} bytes, the data section holds {data_len}")),
        ));
    }
    Ok(())
}

fn check_metadata(value: &Value) -> Result<(), IoErrorKind> {
    match value {
        Value::Object(m) if m.values().all(Value::is_string) => Ok(()),
        other => Err(field_error("__metadata__", "an object of strings", Some(other))),
    }
}

fn usize_array(value: Option<&Value>) -> Option<Vec<usize>> {
    value?.as_array()?.iter().map(|v| v.as_u64().and_then(|x| usize::try_from(x).ok())).collect()
}

fn field_error(field: &str, expected: &str, found: Option<&Value>) -> IoErrorKind {
    let found = found.map_or("missing", json_kind);
    IoErrorKind::Header(format!("field '{field}' is {found}, expected {expected}"))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
