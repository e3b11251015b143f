//! Loading a PyTorch state dict into a module strictly, as PyTorch's
//! `load_state_dict(strict=True)`: the module is built over a `VarBuilder` that records every
//! weight it asks for. A weight it asks for that the state dict lacks or holds with another shape
//! is an error naming it, and so is every weight of the state dict the module did not ask for (a
//! PyTorch option left off in the config, such as `add_bias_kv`, or another model's weights).
//!
//! - [`strict`] (or [`StateDict::build`]): frozen weights, for inference;
//! - [`trainable`] (or [`StateDict::build_trainable`]): every weight copied into a [`Var`] of a
//!   [`VarMap`], to fine-tune with an optimiser; [`Trainable::named_parameters`] lists them by
//!   their PyTorch names, like `named_parameters()`.
//!
//! Building a module straight from a `VarBuilder` (`VarBuilder::from_mmaped_safetensors`,
//! `from_tensors`, a `VarMap` loaded afterwards) cannot notice unused weights; go through this
//! module to load. A state dict is saved from PyTorch with
//! `safetensors.torch.save_file(module.state_dict(), "model.safetensors")`.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::safetensors::{BufferedSafetensors, MmapedSafetensors};
use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

use crate::error::{NnError, Result};

/// A state dict: named tensors and where they came from (for errors).
pub struct StateDict {
    tensors: Box<dyn SimpleBackend>,
    names: BTreeSet<String>,
    origin: String,
}

impl std::fmt::Debug for StateDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateDict").field("origin", &self.origin).field("names", &self.names).finish()
    }
}

impl StateDict {
    /// Reads the safetensors file at `path` into memory.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| refused(&origin, e))?;
        let st = BufferedSafetensors::new(bytes).map_err(|e| refused(&origin, attn::error::one_line(&e)))?;
        let names = st.tensors().into_iter().map(|(name, _)| name).collect();
        Ok(Self { tensors: Box::new(st), names, origin })
    }

    /// Maps the safetensors files at `paths` (one state dict split over several files).
    ///
    /// # Safety
    ///
    /// The files must not be modified while the state dict, or a frozen module built from it,
    /// is alive (memory mapping, as `VarBuilder::from_mmaped_safetensors`).
    pub unsafe fn mmap(paths: &[impl AsRef<Path>]) -> Result<Self> {
        let origin = paths.iter().map(|p| p.as_ref().display().to_string()).collect::<Vec<_>>().join(", ");
        // SAFETY: the caller keeps the files unchanged while they are mapped.
        let st = unsafe { MmapedSafetensors::multi(paths) }.map_err(|e| refused(&origin, attn::error::one_line(&e)))?;
        let names = st.tensors().into_iter().map(|(name, _)| name).collect();
        Ok(Self { tensors: Box::new(st), names, origin })
    }

    /// Tensors already in memory by name; `origin` names them in errors.
    pub fn from_tensors(tensors: HashMap<String, Tensor>, origin: impl Into<String>) -> Self {
        let names = tensors.keys().cloned().collect();
        Self { tensors: Box::new(tensors), names, origin: origin.into() }
    }

    /// The names of the tensors, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// Builds a module with `build` over these weights (frozen, as `dtype` on `device`); refuses
    /// a weight missing, mis-shaped or not used, by name.
    pub fn build<M, E: From<NnError>>(
        &self,
        dtype: DType,
        device: &Device,
        build: impl FnOnce(VarBuilder<'_>) -> std::result::Result<M, E>,
    ) -> std::result::Result<M, E> {
        self.build_over(None, dtype, device, build)
    }

    /// Builds a module with `build` over copies of these weights in trainable [`Var`]s (as
    /// `dtype` on `device`), kept in the returned [`Trainable::varmap`]; refuses a weight missing,
    /// mis-shaped or not used, by name.
    pub fn build_trainable<M, E: From<NnError>>(
        &self,
        dtype: DType,
        device: &Device,
        build: impl FnOnce(VarBuilder<'_>) -> std::result::Result<M, E>,
    ) -> std::result::Result<Trainable<M>, E> {
        let varmap = VarMap::new();
        let module = self.build_over(Some(varmap.clone()), dtype, device, build)?;
        Ok(Trainable { module, varmap })
    }

    fn build_over<M, E: From<NnError>>(
        &self,
        vars: Option<VarMap>,
        dtype: DType,
        device: &Device,
        build: impl FnOnce(VarBuilder<'_>) -> std::result::Result<M, E>,
    ) -> std::result::Result<M, E> {
        let record = Arc::new(Mutex::new(Record::default()));
        let tracked = Tracked { inner: self.tensors.as_ref(), vars, record: record.clone() };
        let result = build(VarBuilder::from_backend(Box::new(tracked), dtype, device.clone()));
        let record = std::mem::take(&mut *record.lock().unwrap_or_else(PoisonError::into_inner));
        match (result, record.fault) {
            (Err(_), Some(fault)) => Err(refused(&self.origin, fault).into()),
            (Err(e), None) => Err(e),
            (Ok(module), _) => {
                let unused: Vec<&str> =
                    self.names.iter().filter(|n| !record.used.contains(*n)).map(String::as_str).collect();
                if unused.is_empty() {
                    Ok(module)
                } else {
                    let reason = format!("holds weights the module does not use: {}", unused.join(", "));
                    Err(refused(&self.origin, reason).into())
                }
            }
        }
    }
}

/// Builds a module with `build` over the state dict in the safetensors file at `path` (frozen
/// weights, as `dtype` on `device`); a weight missing, mis-shaped or unused is an error naming it.
///
/// ```no_run
/// use attn_nn::{load, EncoderLayer, LayerConfig};
/// use candle_core::{DType, Device};
/// # fn main() -> attn_nn::Result<()> {
/// // torch: save_file(nn.TransformerEncoderLayer(512, 8, batch_first=True).state_dict(), "layer.safetensors")
/// let cfg = LayerConfig::new(512, 8);
/// let layer = load::strict("layer.safetensors", DType::F32, &Device::Cpu, |vb| EncoderLayer::new(&cfg, vb))?;
/// # Ok(()) }
/// ```
pub fn strict<M, E: From<NnError>>(
    path: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
    build: impl FnOnce(VarBuilder<'_>) -> std::result::Result<M, E>,
) -> std::result::Result<M, E> {
    StateDict::read(path)?.build(dtype, device, build)
}

/// [`strict`] into trainable [`Var`]s: loads PyTorch weights to fine-tune them.
///
/// ```no_run
/// use attn_nn::{load, AttnMasks, EncoderLayer, LayerConfig, Run};
/// use candle_core::{DType, Device};
/// use candle_nn::Optimizer;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = LayerConfig { dropout: 0.0, ..LayerConfig::new(512, 8) };
/// let t = load::trainable("layer.safetensors", DType::F32, &Device::Cpu, |vb| EncoderLayer::new(&cfg, vb))?;
/// for (name, var) in t.named_parameters() {
///     println!("{name}: {:?}", var.dims()); // self_attn.in_proj_weight: [1536, 512], ...
/// }
/// let mut opt = candle_nn::AdamW::new_lr(t.parameters(), 1e-4)?;
/// let x = attn::random::uniform(&[2, 10, 512], -1.0, 1.0, 0)?;
/// let loss = t.module.forward(&x, &AttnMasks::default(), Run::train())?.out.sqr()?.mean_all()?;
/// opt.backward_step(&loss)?;
/// # Ok(()) }
/// ```
pub fn trainable<M, E: From<NnError>>(
    path: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
    build: impl FnOnce(VarBuilder<'_>) -> std::result::Result<M, E>,
) -> std::result::Result<Trainable<M>, E> {
    StateDict::read(path)?.build_trainable(dtype, device, build)
}

/// A module whose weights are trainable variables, and the variables by PyTorch name.
pub struct Trainable<M> {
    /// The module.
    pub module: M,
    /// Its variables, by PyTorch name (`VarMap::save` writes them back as a state dict).
    pub varmap: VarMap,
}

impl<M: std::fmt::Debug> std::fmt::Debug for Trainable<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.named_parameters().into_iter().map(|(n, _)| n).collect();
        f.debug_struct("Trainable").field("module", &self.module).field("parameters", &names).finish()
    }
}

impl<M> Trainable<M> {
    /// Every parameter by PyTorch name, sorted by name.
    pub fn named_parameters(&self) -> Vec<(String, Var)> {
        named_parameters(&self.varmap)
    }

    /// Every parameter, in the order of [`Self::named_parameters`] (for an optimiser).
    pub fn parameters(&self) -> Vec<Var> {
        self.named_parameters().into_iter().map(|(_, var)| var).collect()
    }
}

/// The variables of `map` (a module's parameters, by PyTorch name), sorted by name.
pub fn named_parameters(map: &VarMap) -> Vec<(String, Var)> {
    let data = map.data().lock().unwrap_or_else(PoisonError::into_inner);
    let mut named: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

fn refused(origin: &str, reason: impl std::fmt::Display) -> NnError {
    NnError::StateDict { origin: origin.to_string(), reason: reason.to_string() }
}

/// What a build asked for: the weights it got, and the first it could not get.
#[derive(Debug, Default)]
struct Record {
    used: BTreeSet<String>,
    fault: Option<String>,
}

/// A backend over a state dict that records the names asked for and, when `vars` is given,
/// hands out each weight as a variable kept there.
struct Tracked<'a> {
    inner: &'a dyn SimpleBackend,
    vars: Option<VarMap>,
    record: Arc<Mutex<Record>>,
}

impl Tracked<'_> {
    fn fail(&self, reason: String) -> candle_core::Error {
        let mut record = self.record.lock().unwrap_or_else(PoisonError::into_inner);
        record.fault.get_or_insert(reason.clone());
        candle_core::Error::Msg(reason)
    }
}

impl SimpleBackend for Tracked<'_> {
    fn get(&self, s: Shape, name: &str, _: Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        if let Some(var) = self.vars.as_ref().and_then(|m| m.data().lock().ok()?.get(name).cloned()) {
            if var.shape() != &s {
                return Err(self.fail(format!("`{name}` is asked for as {:?} and as {s:?}", var.shape())));
            }
            return Ok(var.as_tensor().clone());
        }
        if !self.inner.contains_tensor(name) {
            return Err(self.fail(format!("no weight `{name}` (the module needs one of shape {s:?})")));
        }
        let t = self.inner.get_unchecked(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(self.fail(format!("`{name}` has shape {:?}, the module needs {s:?}", t.shape())));
        }
        self.record.lock().unwrap_or_else(PoisonError::into_inner).used.insert(name.to_string());
        match &self.vars {
            None => Ok(t),
            Some(map) => {
                let var = Var::from_tensor(&t)?;
                map.data().lock().unwrap_or_else(PoisonError::into_inner).insert(name.to_string(), var.clone());
                Ok(var.as_tensor().clone())
            }
        }
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        Err(self.fail(format!("`{name}` was asked for without a shape, which a strict load cannot check")))
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
}
