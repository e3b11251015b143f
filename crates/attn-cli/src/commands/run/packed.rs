//! Packed sequences in `attn run`: an INPUT file holding `cu_seqlens_q` and `cu_seqlens_k`
//! (I32/I64 `[B + 1]`) asks for attention over packed variable-length sequences, `q: [total_q, Hq,
//! Dk]`, `k: [total_k, Hkv, Dk]`, `v: [total_k, Hkv, Dv]`, through `attn::sdpa_varlen_full`.

use super::sourced::Sourced;
use crate::io::{HostTensor, IoError, IoErrorKind};

/// The offsets of packed sequences, `[B + 1]` each.
pub(super) struct Offsets {
    /// `cu_seqlens_q`.
    pub(super) q: Vec<usize>,
    /// `cu_seqlens_k`.
    pub(super) k: Vec<usize>,
}

/// The offsets when the inputs hold `cu_seqlens_q` and `cu_seqlens_k` (I32/I64, rank 1, no
/// negative entry), `None` when they hold neither. One without the other is refused as missing
/// (naming `q_file`, the INPUT file), and beside them a tensor of `dense_only` (`mask`, `bias`,
/// `key_lengths`) is refused: packed sequences have no element masks, and each sequence's keys
/// are its own (sinks join every sequence's rows). The library checks the offsets against each
/// other and the totals.
pub(super) fn offsets(
    cu_q: Option<Sourced>,
    cu_k: Option<Sourced>,
    q_file: &str,
    dense_only: [(&str, &Option<Sourced>); 3],
) -> Result<Option<Offsets>, IoError> {
    let (cu_q, cu_k) = match (cu_q, cu_k) {
        (None, None) => return Ok(None),
        (Some(q), Some(k)) => (q, k),
        (given, _) => {
            let (present, missing) = if given.is_some() { ("q", "k") } else { ("k", "q") };
            let found = format!("cu_seqlens_{present} only: packed sequences need both offsets");
            return Err(IoError::tensor(q_file, format!("cu_seqlens_{missing}"), IoErrorKind::Missing { found }));
        }
    };
    if let Some((name, Some(s))) = dense_only.into_iter().find(|(_, s)| s.is_some()) {
        let why = format!(
            "packed sequences (cu_seqlens_q, cu_seqlens_k) take no {name}: each sequence attends to its own keys"
        );
        return Err(IoError::tensor(&s.file, name, IoErrorKind::Value(why)));
    }
    Ok(Some(Offsets {
        q: cu_q.convert("cu_seqlens_q", |t| rank1_counts(t, "[B + 1]"))?,
        k: cu_k.convert("cu_seqlens_k", |t| rank1_counts(t, "[B + 1]"))?,
    }))
}

/// The entries of a rank-1 I32/I64 tensor of shape `shape` (in words) as counts, none negative.
pub(super) fn rank1_counts(t: HostTensor, shape: &str) -> Result<Vec<usize>, IoErrorKind> {
    match t.shape.len() {
        1 => t.to_usize_vec(),
        _ => Err(IoErrorKind::Shape { found: t.shape, expected: format!("rank 1 {shape}") }),
    }
}
