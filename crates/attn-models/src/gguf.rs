//! GGUF files (llama.cpp's format) through candle's reader: metadata read with errors naming the
//! file and key, and every tensor dequantized to `f32` (the parity mode) under its GGUF name.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

/// An open GGUF file: its metadata and tensor directory (the tensors are read on demand).
#[derive(Debug)]
pub struct Gguf {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl Gguf {
    /// Opens `path` and reads its header; refuses a file that is missing, not GGUF (magic) or
    /// truncated within its header.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::file(path, e))?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader)
            .map_err(|e| ModelError::file(path, format!("not a readable GGUF file: {}", attn::error::one_line(&e))))?;
        Ok(Self { path: path.to_path_buf(), content, reader })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `general.architecture` (`llama`, `gemma3`, ...).
    pub fn architecture(&self) -> Result<&str> {
        self.string("general.architecture")
    }

    fn value(&self, key: &str) -> Result<&Value> {
        self.content.metadata.get(key).ok_or_else(|| ModelError::field(&self.path, key, "missing"))
    }

    /// Whether metadata `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.content.metadata.contains_key(key)
    }

    /// An integer metadata value (any GGUF integer type), non-negative.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.value(key)?;
        integer(v).and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
            ModelError::field(&self.path, key, format!("expected a non-negative integer, found {}", kind(v)))
        })
    }

    /// A float metadata value (f32 or f64).
    pub fn f64(&self, key: &str) -> Result<f64> {
        match self.value(key)? {
            Value::F32(x) => Ok(f64::from(*x)),
            Value::F64(x) => Ok(*x),
            v => Err(ModelError::field(&self.path, key, format!("expected a float, found {}", kind(v)))),
        }
    }

    /// A boolean metadata value, `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.content.metadata.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ModelError::field(&self.path, key, format!("expected a bool, found {}", kind(v)))),
        }
    }

    /// A string metadata value.
    pub fn string(&self, key: &str) -> Result<&str> {
        match self.value(key)? {
            Value::String(s) => Ok(s),
            v => Err(ModelError::field(&self.path, key, format!("expected a string, found {}", kind(v)))),
        }
    }

    /// A string array.
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                v => Err(ModelError::field(
                    &self.path,
                    format!("{key}[{i}]"),
                    format!("expected a string, found {}", kind(v)),
                )),
            })
            .collect()
    }

    /// An integer array.
    pub fn integers(&self, key: &str) -> Result<Vec<i64>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                integer(v).ok_or_else(|| {
                    ModelError::field(
                        &self.path,
                        format!("{key}[{i}]"),
                        format!("expected an integer, found {}", kind(v)),
                    )
                })
            })
            .collect()
    }

    /// A float array.
    pub fn floats(&self, key: &str) -> Result<Vec<f32>> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::F32(x) => Ok(*x),
                Value::F64(x) => Ok(*x as f32),
                v => Err(ModelError::field(
                    &self.path,
                    format!("{key}[{i}]"),
                    format!("expected a float, found {}", kind(v)),
                )),
            })
            .collect()
    }

    fn array(&self, key: &str) -> Result<&Vec<Value>> {
        match self.value(key)? {
            Value::Array(a) => Ok(a),
            v => Err(ModelError::field(&self.path, key, format!("expected an array, found {}", kind(v)))),
        }
    }

    /// The names of the file's tensors, sorted.
    pub fn tensor_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.content.tensor_infos.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The file's tensor types by name (`Q4_1`, `F32`, ...), for listings.
    pub fn tensor_types(&self) -> HashMap<&str, String> {
        self.content.tensor_infos.iter().map(|(n, i)| (n.as_str(), format!("{:?}", i.ggml_dtype))).collect()
    }

    /// Every tensor dequantized to `f32`, shaped as PyTorch lays it out (`[out, in]` for a
    /// matrix), by GGUF name; refuses one whose data runs past the end of the file.
    pub fn dequantize_all(&mut self) -> Result<HashMap<String, Tensor>> {
        let names: Vec<String> = self.content.tensor_infos.keys().cloned().collect();
        let mut out = HashMap::with_capacity(names.len());
        for name in names {
            let q = self
                .content
                .tensor(&mut self.reader, &name, &Device::Cpu)
                .and_then(|q| q.dequantize(&Device::Cpu))
                .map_err(|e| ModelError::field(&self.path, &name, attn::error::one_line(&e)))?;
            out.insert(name, q);
        }
        Ok(out)
    }
}

fn integer(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

/// A value's type in words, for errors.
fn kind(v: &Value) -> String {
    format!("{:?}", v.value_type()).to_lowercase()
}
