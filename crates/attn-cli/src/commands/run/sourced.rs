//! A tensor of `attn run`'s inputs with the file it came from ([`Sourced`]), so that every
//! refusal of it names both.

use crate::io::{HostTensor, IoError, IoErrorKind};

/// A tensor and the file it came from.
pub(super) struct Sourced {
    pub(super) file: String,
    pub(super) tensor: HostTensor,
}

impl Sourced {
    /// The tensor converted by `f`; a refusal names the file and the tensor `name`.
    pub(super) fn convert<T>(
        self,
        name: &str,
        f: impl FnOnce(HostTensor) -> Result<T, IoErrorKind>,
    ) -> Result<T, IoError> {
        let Sourced { file, tensor } = self;
        f(tensor).map_err(|kind| IoError::tensor(file, name, kind))
    }
}
