//! `attn run --linear MAP`: linear attention ([`attn::linear_attention`]) instead of softmax
//! attention on the same inputs, `φ` applied to `q` and `k` as given (no `1/√D` scale, `ε` =
//! [`attn::linear::EPS`]), causal with `--causal`, key padding from `key_lengths`; it writes `out`
//! and, with `grad_out`, `dq`, `dk`, `dv`. Tensors and flags with no meaning for it (a mask, a bias,
//! sinks, packed offsets, `--weights`, a pattern) are refused.

use attn::linear::{FeatureMap, LinearOptions};

use super::sourced::Sourced;
use crate::io::{IoError, IoErrorKind};

/// The feature maps `attn run --linear` offers (FAVOR+ is the library's and `attn bench`'s).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearMap {
    /// `elu(x) + 1`.
    Elu,
    /// `max(x, 0)`.
    Relu,
    /// `x`.
    Identity,
}

impl LinearMap {
    /// The library's options for this map, causal or not.
    pub fn options(self, causal: bool) -> LinearOptions {
        let map = match self {
            LinearMap::Elu => FeatureMap::Elu,
            LinearMap::Relu => FeatureMap::Relu,
            LinearMap::Identity => FeatureMap::Identity,
        };
        LinearOptions::new(map).causal(causal)
    }
}

/// Refuses the first of `present` (`(name, tensor)`) that is given: linear attention takes none
/// of them.
pub(super) fn refuse_softmax_only<'a>(
    present: impl IntoIterator<Item = (&'a str, &'a Option<Sourced>)>,
) -> Result<(), IoError> {
    match present.into_iter().find_map(|(n, s)| s.as_ref().map(|s| (n, s))) {
        Some((name, s)) => {
            let why = format!("linear attention (--linear) takes no {name}; key padding comes from key_lengths");
            Err(IoError::tensor(&s.file, name, IoErrorKind::Value(why)))
        }
        None => Ok(()),
    }
}
