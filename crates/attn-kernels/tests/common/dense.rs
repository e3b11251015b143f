//! Owned mask and bias tensors ([`Dense`]) of rank 1 to 4, broadcast right-aligned to
//! `[B, Hq, Lq, Lk]`, and the enumeration of every broadcast shape a target allows
//! ([`broadcast_shape`], numbered `0..SHAPE_CODES`).

/// An owned mask or bias tensor of rank 1 to 4, broadcast right-aligned to `[B, Hq, Lq, Lk]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense<T> {
    /// Shape as given (rank 1 to 4).
    pub shape: Vec<usize>,
    /// Row-major data, `shape.iter().product()` elements.
    pub data: Vec<T>,
}

impl<T: Copy> Dense<T> {
    /// The element broadcast to target position `[b, h, i, j]` (index 0 on size-1 dimensions).
    pub fn at(&self, idx: [usize; 4]) -> T {
        self.data[self.offset(idx)]
    }

    /// The offset into `data` of target position `[b, h, i, j]`.
    pub fn offset(&self, idx: [usize; 4]) -> usize {
        let rank = self.shape.len();
        self.shape.iter().enumerate().fold(0, |off, (a, &n)| off * n + if n == 1 { 0 } else { idx[4 - rank + a] })
    }
}

/// Number of distinct broadcast shapes [`broadcast_shape`] can build (ranks 1 to 4, each subset
/// of dimensions set to 1).
pub const SHAPE_CODES: usize = 2 + 4 + 8 + 16;

/// The broadcast shape numbered `code < SHAPE_CODES` for `target = [B, Hq, Lq, Lk]`: the last
/// `rank` target dimensions with those selected by the code's bit pattern replaced by 1.
pub fn broadcast_shape(target: [usize; 4], code: usize) -> Vec<usize> {
    let (rank, ones) = match code {
        0..=1 => (1, code),
        2..=5 => (2, code - 2),
        6..=13 => (3, code - 6),
        _ => (4, code - 14),
    };
    (0..rank).map(|a| if ones >> a & 1 == 1 { 1 } else { target[4 - rank + a] }).collect()
}
