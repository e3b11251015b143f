//! The bytes of a paged cache's keys or values in one storage type ([`KvDtype`]): pages grown on
//! demand, rows written with quantize-on-write, pages copied (copy-on-write of a shared page),
//! and the kernels' view of them ([`Pages`]).

use attn_kernels::paged::{fp8_encode, q8_encode, Pages, FP8_MAX, Q8_BLOCK};
use half::{bf16, f16};

use crate::error::{AttnLibError, Result};

/// How a paged cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f32, as computed.
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// llama.cpp's q8_0: signed bytes in blocks of 32 along `D`, an f16 scale per block.
    Int8,
    /// fp8 e4m3 with one f32 scale per key/value head, set from the first rows written.
    Fp8,
}

impl KvDtype {
    /// The spelling of the CLI and Python: `f32`, `f16`, `bf16`, `int8`, `fp8`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Int8 => "int8",
            KvDtype::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = AttnLibError;

    fn from_str(s: &str) -> Result<Self> {
        [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Int8, KvDtype::Fp8]
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| AttnLibError::Value {
                field: "kv_dtype",
                reason: format!("{s:?}; expected one of f32, f16, bf16, int8, fp8"),
            })
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Headroom of the fp8 scale over the first rows' largest magnitude: later rows up to this many
/// times larger still fit below e4m3's 448 (e4m3's relative step is the same at every magnitude,
/// so the headroom costs no precision until values 2⁻⁶·448/4 below the first ones).
const FP8_HEADROOM: f32 = 4.0;

/// One tensor's pages, `[pages, page_size, Hkv, D]` row-major.
#[derive(Debug, Clone)]
pub(super) enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Int8 {
        values: Vec<i8>,
        scales: Vec<f16>,
    },
    /// `scales` is empty until the first write.
    Fp8 {
        values: Vec<u8>,
        scales: Vec<f32>,
    },
}

impl Store {
    pub(super) fn new(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::F32 => Store::F32(Vec::new()),
            KvDtype::F16 => Store::F16(Vec::new()),
            KvDtype::Bf16 => Store::Bf16(Vec::new()),
            KvDtype::Int8 => Store::Int8 { values: Vec::new(), scales: Vec::new() },
            KvDtype::Fp8 => Store::Fp8 { values: Vec::new(), scales: Vec::new() },
        }
    }

    /// Grows (or keeps) the storage to `elems` elements, zero-filled.
    pub(super) fn resize(&mut self, elems: usize) -> Result<()> {
        fn grow<T: Clone>(v: &mut Vec<T>, n: usize, zero: T) -> Result<()> {
            v.try_reserve_exact(n.saturating_sub(v.len())).map_err(|_| AttnLibError::Value {
                field: "paged cache",
                reason: format!("cannot allocate {n} elements for its pages"),
            })?;
            v.resize(n, zero);
            Ok(())
        }
        match self {
            Store::F32(x) => grow(x, elems, 0.0),
            Store::F16(x) => grow(x, elems, f16::ZERO),
            Store::Bf16(x) => grow(x, elems, bf16::ZERO),
            Store::Int8 { values, scales } => {
                grow(values, elems, 0)?;
                grow(scales, elems / Q8_BLOCK, f16::ZERO)
            }
            Store::Fp8 { values, .. } => grow(values, elems, 0),
        }
    }

    /// Writes `x: [n, Hkv, D]` (one row per position and head, `d` long) at row `r0`
    /// (`r = (page · page_size + slot) · Hkv + head`), quantized as the storage is.
    pub(super) fn write(&mut self, r0: usize, x: &[f32], heads: usize, d: usize) {
        let span = r0 * d..r0 * d + x.len();
        match self {
            Store::F32(v) => v[span].copy_from_slice(x),
            Store::F16(v) => v[span].iter_mut().zip(x).for_each(|(o, &a)| *o = f16::from_f32(a)),
            Store::Bf16(v) => v[span].iter_mut().zip(x).for_each(|(o, &a)| *o = bf16::from_f32(a)),
            Store::Int8 { values, scales } => {
                q8_encode(x, &mut values[span.clone()], &mut scales[span.start / Q8_BLOCK..span.end / Q8_BLOCK])
            }
            Store::Fp8 { values, scales } => {
                if scales.is_empty() {
                    *scales = (0..heads)
                        .map(|h| {
                            let amax = x.chunks(d).skip(h).step_by(heads).flatten().fold(0.0f32, |m, a| m.max(a.abs()));
                            if amax > 0.0 && amax.is_finite() {
                                amax * FP8_HEADROOM / FP8_MAX
                            } else {
                                1.0
                            }
                        })
                        .collect();
                }
                for (i, (row, out)) in x.chunks(d).zip(values[span].chunks_mut(d)).enumerate() {
                    let inv = 1.0 / scales[(r0 + i) % heads];
                    row.iter().zip(out).for_each(|(&a, o)| *o = fp8_encode(a * inv));
                }
            }
        }
    }

    /// Copies elements `from..from + n` to `to..to + n` (a page onto another).
    pub(super) fn copy(&mut self, from: usize, to: usize, n: usize) {
        match self {
            Store::F32(v) => v.copy_within(from..from + n, to),
            Store::F16(v) => v.copy_within(from..from + n, to),
            Store::Bf16(v) => v.copy_within(from..from + n, to),
            Store::Int8 { values, scales } => {
                values.copy_within(from..from + n, to);
                scales.copy_within(from / Q8_BLOCK..(from + n) / Q8_BLOCK, to / Q8_BLOCK);
            }
            Store::Fp8 { values, .. } => values.copy_within(from..from + n, to),
        }
    }

    /// The kernels' view; an fp8 store never written gets unit scales.
    pub(super) fn pages<'a>(&'a self, unit: &'a [f32]) -> Pages<'a> {
        match self {
            Store::F32(v) => Pages::F32(v),
            Store::F16(v) => Pages::F16(v),
            Store::Bf16(v) => Pages::Bf16(v),
            Store::Int8 { values, scales } => Pages::Q8 { values, scales },
            Store::Fp8 { values, scales } => {
                Pages::Fp8 { values, scales: if scales.is_empty() { unit } else { scales } }
            }
        }
    }
}
