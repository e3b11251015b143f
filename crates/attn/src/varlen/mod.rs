//! Attention over packed variable-length sequences on candle tensors, FlashAttention's
//! `flash_attn_varlen_func`: `q: [total_q, Hq, Dk]`, `k: [total_k, Hkv, Dk]`,
//! `v: [total_k, Hkv, Dv]` hold `B` sequences one after another with no padding;
//! `cu_seqlens_q` and `cu_seqlens_k` (`[B + 1]`, from 0 to the totals, never decreasing; see
//! [`cu_seqlens`]) say where each starts. Sequence `s` attends only within itself, its queries
//! `cu_seqlens_q[s]..cu_seqlens_q[s + 1]` to its keys `cu_seqlens_k[s]..cu_seqlens_k[s + 1]`.
//!
//! Options are [`SdpaOptions`], applied within each sequence: `causal`, `align` (bottom-right
//! aligns each sequence's last query with its own last key), `window`, `scale`, `softcap`,
//! `dropout` (sequence `s` keyed by [`Dropout::for_sequence`](crate::Dropout::for_sequence)),
//! `kernel` and `compute` (bf16 products forward and backward, each sequence computed as the dense
//! call on it alone), and `sinks` (`[Hq]`, the same logits joining every sequence's rows; their
//! gradient is the sum of the sequences'). `mask`, `bias`, `key_lengths` and `block_mask` have no
//! packed form and `score_mod` is not supported yet: all are refused naming the field, as is
//! `return_weights` (the weights of sequences of different lengths form no tensor).
//!
//! Dtypes, devices and strides as for [`sdpa`](crate::sdpa()): `f32`, `f16`, `bf16`, `f64` inputs
//! computed in `f32` (keys and values stored as `f16`/`bf16` read in place), the output in `q`'s
//! dtype, CPU only. The output is differentiable through candle's autograd with respect to `q`,
//! `k` and `v` (the packed backward kernel, dropout replayed from its seed).
//!
//! The README's example (its text lives in `doc/varlen-example.rs`; `tests/readme.rs` checks that
//! README.md quotes it word for word):
//!
#![doc = concat!(
    "```\n",
    "# #![deny(warnings, unused)]\n",
    "# use candle_core::Var;\n",
    "# let var = |shape: &[usize], seed| -> attn::Result<Var> {\n",
    "#     Ok(Var::from_tensor(&attn::random::uniform(shape, -1.0, 1.0, seed)?)?)\n",
    "# };\n",
    "# let (q, k, v) = (var(&[16, 4, 8], 1)?, var(&[16, 2, 8], 2)?, var(&[16, 2, 8], 3)?);\n",
    "# let target = attn::random::uniform(&[16, 4, 8], -1.0, 1.0, 4)?;\n",
    include_str!("../../doc/varlen-example.rs"),
    "# assert_eq!((cu.as_slice(), r.lse.dims()), (&[0, 5, 7, 16][..], &[4, 16][..]));\n",
    "# assert_eq!(grads.get(&k).unwrap().dims(), &[16, 2, 8]);\n",
    "# Ok::<(), attn::AttnLibError>(())\n",
    "```",
)]

mod op;

use candle_core::{DType, Tensor};

use crate::convert::{as_key_value, as_query, check_input};
use crate::error::{AttnLibError, Result};
use crate::options::SdpaOptions;

/// Everything one packed call computes.
#[derive(Debug, Clone)]
pub struct SdpaVarlenOutput {
    /// `[total_q, Hq, Dv]`, in `q`'s dtype.
    pub out: Tensor,
    /// Natural log-sum-exp of each row's scores, `[Hq, total_q]` (FlashAttention's layout), `f32`;
    /// `-inf` for a row with no allowed key.
    pub lse: Tensor,
}

/// Attention over packed sequences: `q: [total_q, Hq, Dk]`, `k: [total_k, Hkv, Dk]`,
/// `v: [total_k, Hkv, Dv]` cut by `cu_seqlens_q` and `cu_seqlens_k` (`[B + 1]`) →
/// `[total_q, Hq, Dv]`. See the [module](self) header.
///
/// ```
/// use attn::{cu_seqlens, sdpa_varlen, SdpaOptions};
/// // Two sequences of 3 and 5 tokens, 2 heads of 8 dimensions, packed as [8, 2, 8].
/// let q = attn::random::uniform(&[8, 2, 8], -1.0, 1.0, 1)?;
/// let cu = cu_seqlens(&[3, 5]);
/// assert_eq!(cu, [0, 3, 8]);
/// let out = sdpa_varlen(&q, &q, &q, &cu, &cu, &SdpaOptions::default().causal(true))?;
/// assert_eq!(out.dims(), &[8, 2, 8]);
/// # Ok::<(), attn::AttnLibError>(())
/// ```
pub fn sdpa_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &[usize],
    cu_seqlens_k: &[usize],
    opts: &SdpaOptions,
) -> Result<Tensor> {
    Ok(sdpa_varlen_full(q, k, v, cu_seqlens_q, cu_seqlens_k, opts)?.out)
}

/// [`sdpa_varlen`] with the log-sum-exp `[Hq, total_q]`.
pub fn sdpa_varlen_full(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &[usize],
    cu_seqlens_k: &[usize],
    opts: &SdpaOptions,
) -> Result<SdpaVarlenOutput> {
    for (name, t, what) in [("q", q, "total_q, Hq, Dk"), ("k", k, "total_k, Hkv, Dk"), ("v", v, "total_k, Hkv, Dv")] {
        check_input(name, t)?;
        if t.rank() != 3 {
            return Err(AttnLibError::Shape {
                tensor: name,
                found: t.dims().to_vec(),
                expected: format!("rank 3 [{what}]"),
            });
        }
    }
    if opts.return_weights {
        return Err(AttnLibError::Value {
            field: "return_weights",
            reason: "packed sequences return no weights (sequences of different lengths form no tensor)".into(),
        });
    }

    let (q3, k3, v3) = (as_query(q)?, as_key_value(k)?, as_key_value(v)?);
    let crate::op::Outputs { out, lse, .. } = op::forward(&q3, &k3, &v3, [cu_seqlens_q, cu_seqlens_k], opts)?;
    let dtype = q.dtype();
    Ok(SdpaVarlenOutput { out: if dtype == DType::F32 { out } else { out.to_dtype(dtype)? }, lse })
}

/// The offsets `[B + 1]` of sequences of `lengths` packed one after another: `[0, l_0, l_0 + l_1, …]`.
pub fn cu_seqlens(lengths: &[usize]) -> Vec<usize> {
    let mut at = 0;
    std::iter::once(0)
        .chain(lengths.iter().map(|&l| {
            at += l;
            at
        }))
        .collect()
}
