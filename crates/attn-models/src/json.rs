//! A JSON file's fields read with errors that name the file and the key (`config.json`,
//! `sentence_bert_config.json`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{ModelError, Result};

/// A parsed JSON object and the file it came from.
#[derive(Debug)]
pub struct JsonFile {
    path: PathBuf,
    value: Value,
}

impl JsonFile {
    /// Reads and parses `path`; refuses a file that is missing, not JSON or not an object.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::file(path, e))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::file(path, format!("not JSON: {e}")))?;
        if !value.is_object() {
            return Err(ModelError::file(path, "expected a JSON object"));
        }
        Ok(Self { path: path.to_path_buf(), value })
    }

    fn get(&self, key: &str) -> Option<&Value> {
        // `a.b` reads key `b` of the object under `a`.
        key.split('.').try_fold(&self.value, |v, k| v.get(k)).filter(|v| !v.is_null())
    }

    /// Whether `key` is present and not null.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// An integer field that may also be a list of integers (its first), `None` when absent.
    pub fn first_usize(&self, key: &str) -> Result<Option<usize>> {
        let v = match self.get(key) {
            None => return Ok(None),
            Some(serde_json::Value::Array(a)) => a.first(),
            Some(v) => Some(v),
        };
        v.map(|v| {
            v.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| ModelError::field(&self.path, key, format!("expected an integer, found {v}")))
        })
        .transpose()
    }

    /// A non-negative integer field.
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.usize_or(key, None)
    }

    /// A non-negative integer field, or `default` when absent.
    pub fn usize_or(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.get(key) {
            None => default.ok_or_else(|| ModelError::field(&self.path, key, "missing")),
            Some(v) => v.as_u64().map(|n| n as usize).ok_or_else(|| {
                ModelError::field(&self.path, key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    /// A number field, or `default` when absent.
    pub fn f64_or(&self, key: &str, default: Option<f64>) -> Result<f64> {
        match self.get(key) {
            None => default.ok_or_else(|| ModelError::field(&self.path, key, "missing")),
            Some(v) => {
                v.as_f64().ok_or_else(|| ModelError::field(&self.path, key, format!("expected a number, found {v}")))
            }
        }
    }

    /// A string field, or `default` when absent.
    pub fn str_or<'a>(&'a self, key: &str, default: Option<&'a str>) -> Result<&'a str> {
        match self.get(key) {
            None => default.ok_or_else(|| ModelError::field(&self.path, key, "missing")),
            Some(v) => {
                v.as_str().ok_or_else(|| ModelError::field(&self.path, key, format!("expected a string, found {v}")))
            }
        }
    }

    /// A boolean field, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| ModelError::field(&self.path, key, format!("expected true or false, found {v}"))),
        }
    }

    /// The error for `key` holding an unsupported value.
    pub fn unsupported(&self, key: &str, reason: impl std::fmt::Display) -> ModelError {
        ModelError::field(&self.path, key, reason)
    }
}
