//! One module fixture as written by `scripts/gen_module_fixtures.py`: its tensors (F64, I64 token
//! ids, BOOL masks) by name, the module kind, the configuration (JSON) and the masks' polarities
//! from the safetensors metadata. Every problem is an error naming the file and the tensor or field.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use attn_testkit::fixtures;
use candle_core::{Device, Tensor};
use safetensors::Dtype;
use serde_json::Value;

/// The directory holding the fixtures.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// The names (file stems) of every `*.safetensors` fixture in `dir`, sorted.
pub fn fixture_names(dir: &Path) -> Vec<String> {
    fixtures::safetensors_in(dir)
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect()
}

/// A stored tensor's elements, row-major.
#[derive(Debug, Clone)]
pub enum Data {
    /// Parameters, float inputs, additive masks, expected results.
    F64(Vec<f64>),
    /// Token ids.
    I64(Vec<i64>),
    /// Boolean masks.
    Bool(Vec<bool>),
}

/// A stored tensor.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The shape as stored.
    pub shape: Vec<usize>,
    /// The elements.
    pub data: Data,
}

/// One fixture file.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// The case name (file stem), for messages.
    pub name: String,
    /// Which module (`mha`, `encoder_layer`, ..., `alibi`, `sinusoidal`).
    pub kind: String,
    /// The module's configuration and the call's flags.
    pub config: Config,
    /// `block` or `keep` per boolean mask name.
    pub polarity: HashMap<String, String>,
    /// Every tensor by its stored name.
    pub tensors: BTreeMap<String, Stored>,
}

impl Fixture {
    /// Reads the fixture `<name>.safetensors`.
    pub fn load(name: &str) -> Result<Self, String> {
        let path = fixture_dir().join(format!("{name}.safetensors"));
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (st, meta) = fixtures::parse(name, &bytes)?;
        let field = |key: &str| meta.get(key).ok_or_else(|| format!("{name}: metadata `{key}` missing"));
        let json = |key: &str| -> Result<Value, String> {
            serde_json::from_str(field(key)?).map_err(|e| format!("{name}: metadata `{key}`: {e}"))
        };
        let polarity = serde_json::from_value(json("masks")?).map_err(|e| format!("{name}: metadata `masks`: {e}"))?;
        let mut tensors = BTreeMap::new();
        for (tname, view) in st.tensors() {
            let bytes = view.data();
            let data = match view.dtype() {
                Dtype::F64 => Data::F64(fixtures::le_f64(bytes)),
                Dtype::I64 => Data::I64(fixtures::le_i64(bytes)),
                Dtype::BOOL => Data::Bool(fixtures::flags(bytes)),
                other => return Err(format!("{name}: `{tname}` has dtype {other:?}, expected F64, I64 or BOOL")),
            };
            tensors.insert(tname, Stored { shape: view.shape().to_vec(), data });
        }
        Ok(Self {
            name: name.to_string(),
            kind: field("module")?.clone(),
            config: Config { case: name.to_string(), value: json("config")? },
            polarity,
            tensors,
        })
    }

    /// The stored tensor `tensor`.
    pub fn get(&self, tensor: &str) -> Result<&Stored, String> {
        self.tensors.get(tensor).ok_or_else(|| format!("{}: tensor `{tensor}` missing", self.name))
    }

    /// The F64 tensor `tensor` as a slice.
    pub fn f64s(&self, tensor: &str) -> Result<&[f64], String> {
        match &self.get(tensor)?.data {
            Data::F64(x) => Ok(x),
            _ => Err(format!("{}: `{tensor}` is not F64", self.name)),
        }
    }

    /// The F64 tensor `tensor` rounded to an `f32` candle tensor of its shape.
    pub fn f32_tensor(&self, tensor: &str) -> Result<Tensor, String> {
        let data: Vec<f32> = self.f64s(tensor)?.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(data, self.get(tensor)?.shape.as_slice(), &Device::Cpu)
            .map_err(|e| format!("{}: `{tensor}`: {e}", self.name))
    }

    /// `(suffix, tensor)` of every tensor named `<prefix><suffix>`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a Stored)> + 'a {
        self.tensors.iter().filter_map(move |(n, t)| n.strip_prefix(prefix).map(|s| (s, t)))
    }
}

/// A case's configuration (a JSON object), read field by field with errors naming the case.
#[derive(Debug, Clone)]
pub struct Config {
    case: String,
    value: Value,
}

impl Config {
    fn field(&self, key: &str) -> Result<&Value, String> {
        self.value.get(key).ok_or_else(|| format!("{}: config field `{key}` missing", self.case))
    }

    fn bad<T>(&self, key: &str, what: &str) -> Result<T, String> {
        Err(format!("{}: config field `{key}` is not {what}", self.case))
    }

    /// A non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize, String> {
        match self.field(key)?.as_u64() {
            Some(x) => Ok(x as usize),
            None => self.bad(key, "a non-negative integer"),
        }
    }

    /// A non-negative integer or `null`.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, String> {
        self.nullable(key, Self::usize)
    }

    /// `None` for `null`, else the field read by `read`.
    fn nullable<T>(&self, key: &str, read: fn(&Self, &str) -> Result<T, String>) -> Result<Option<T>, String> {
        if self.field(key)?.is_null() {
            Ok(None)
        } else {
            read(self, key).map(Some)
        }
    }

    /// A number.
    pub fn f64(&self, key: &str) -> Result<f64, String> {
        match self.field(key)?.as_f64() {
            Some(x) => Ok(x),
            None => self.bad(key, "a number"),
        }
    }

    /// A number or `null`.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, String> {
        self.nullable(key, Self::f64)
    }

    /// A boolean; an absent field is `false`.
    pub fn flag(&self, key: &str) -> Result<bool, String> {
        self.flag_or(key, false)
    }

    /// A boolean; an absent field is `default` (fixtures older than the field).
    pub fn flag_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.value.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().map_or_else(|| self.bad(key, "a boolean"), Ok),
        }
    }

    /// A string or `null`.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, String> {
        match self.field(key)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            _ => self.bad(key, "a string"),
        }
    }

    /// A string.
    pub fn str(&self, key: &str) -> Result<&str, String> {
        self.opt_str(key)?.map_or_else(|| self.bad(key, "a string"), Ok)
    }
}
