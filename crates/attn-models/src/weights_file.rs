//! A model directory's `model.safetensors` read whole into tensors by name, with errors naming
//! the file (the loaders then rename or drop tensors before building strictly).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

/// The tensors of the safetensors file `path`; `missing` says what its absence means.
pub fn read(path: &Path, missing: &str) -> Result<HashMap<String, Tensor>> {
    if !path.exists() {
        return Err(ModelError::file(path, missing));
    }
    let bytes = std::fs::read(path).map_err(|e| ModelError::file(path, e))?;
    candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| ModelError::file(path, format!("not a safetensors file: {}", attn::error::one_line(&e))))
}
