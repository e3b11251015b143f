//! "Attention Is All You Need"'s sinusoidal positional encoding,
//! `PE[p, 2i] = sin(p / 10000^(2i/d))`, `PE[p, 2i+1] = cos(p / 10000^(2i/d))`, added to the
//! embeddings and followed by dropout.

use candle_core::{Device, Tensor};

use crate::dropout::{Dropout, Mode};
use crate::error::{NnError, Result};

/// The table `[max_len, d]` (computed in `f64`, stored as `f32`).
pub fn sinusoidal_table(max_len: usize, d: usize) -> Result<Tensor> {
    let mut data = vec![0f32; max_len * d];
    for (p, row) in data.chunks_mut(d.max(1)).take(max_len).enumerate() {
        for (c, x) in row.iter_mut().enumerate() {
            let freq = 10000f64.powf(-((c - c % 2) as f64) / d as f64);
            let a = p as f64 * freq;
            *x = if c % 2 == 0 { a.sin() } else { a.cos() } as f32;
        }
    }
    Ok(Tensor::from_vec(data, (max_len, d), &Device::Cpu)?)
}

/// Adds the encoding of positions `offset..offset+L` and applies dropout.
///
/// ```
/// use attn_nn::position::sinusoidal::PositionalEncoding;
/// # fn main() -> attn_nn::Result<()> {
/// let pe = PositionalEncoding::new(100, 16, 0.1, 0, "pe")?;
/// let x = attn::random::uniform(&[2, 7, 16], -1.0, 1.0, 1)?; // [B, L, d]
/// assert_eq!(pe.forward(&x, 0, attn_nn::Mode::Eval)?.dims(), [2, 7, 16]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PositionalEncoding {
    /// `[max_len, d]`.
    table: Tensor,
    dropout: Dropout,
}

impl PositionalEncoding {
    /// The encoding for up to `max_len` positions of width `d`; dropout `p` seeded by
    /// `(seed, path)`.
    pub fn new(max_len: usize, d: usize, p: f32, seed: u64, path: &str) -> Result<Self> {
        Ok(Self { table: sinusoidal_table(max_len, d)?, dropout: Dropout::new(p, seed, path) })
    }

    /// `x: [B, L, d]` → `[B, L, d]`, positions starting at `offset`.
    pub fn forward(&self, x: &Tensor, offset: usize, mode: Mode) -> Result<Tensor> {
        let (max_len, d) = self.table.dims2()?;
        let l = x.dim(1)?;
        if x.rank() != 3 || x.dim(2)? != d || offset + l > max_len {
            return Err(NnError::Input {
                module: "PositionalEncoding",
                input: "x",
                found: x.dims().to_vec(),
                expected: format!("[B, L, {d}] with offset {offset} + L <= max_len {max_len}"),
            });
        }
        let pe = self.table.narrow(0, offset, l)?.to_dtype(x.dtype())?;
        self.dropout.forward(&x.broadcast_add(&pe)?, mode)
    }

    /// Packed rows `x: [total, d]` → `[total, d]`, each row at its position within its sequence
    /// (`positions`, from [`crate::Packed::positions`]).
    pub fn forward_packed(&self, x: &Tensor, positions: &[usize], mode: Mode) -> Result<Tensor> {
        let (max_len, d) = self.table.dims2()?;
        let fits = matches!(x.dims(), [total, w] if *w == d && *total == positions.len());
        if !fits || positions.iter().any(|&p| p >= max_len) {
            return Err(NnError::Input {
                module: "PositionalEncoding",
                input: "x",
                found: x.dims().to_vec(),
                expected: format!("packed rows [total, {d}], one position each, below max_len {max_len}"),
            });
        }
        let index: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let index = Tensor::from_vec(index, positions.len(), self.table.device())?;
        let pe = self.table.index_select(&index, 0)?.to_dtype(x.dtype())?;
        self.dropout.forward(&(x + pe)?, mode)
    }
}
