//! Strided read-only views over plain slices: the `[B, H, L, D]` inputs (last dimension contiguous)
//! and the broadcastable mask/bias tensors (right-aligned to `[B, Hq, Lq, Lk]`, stride 0 on every
//! dimension of size 1, so nothing is ever materialised).

use crate::error::{AttnError, Result};

/// A 4-D view `[B, H, L, D]` over `data` with element strides for B, H and L; D is contiguous.
#[derive(Debug, Clone, Copy)]
pub struct View4<'a, T> {
    data: &'a [T],
    dims: [usize; 4],
    strides: [usize; 3],
}

impl<'a, T> View4<'a, T> {
    /// A contiguous row-major view: `data.len()` must equal the product of `dims`.
    pub fn contiguous(name: &'static str, data: &'a [T], dims: [usize; 4]) -> Result<Self> {
        let n = checked_product(name, &dims)?;
        if data.len() != n {
            return Err(AttnError::Layout {
                tensor: name,
                reason: format!("{} elements for shape {:?}, expected {}", data.len(), dims, n),
            });
        }
        let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3]];
        Ok(Self { data, dims, strides })
    }

    /// A strided view: element `[b, h, l, d]` is `data[b*s0 + h*s1 + l*s2 + d]`. Every reachable
    /// element must lie inside `data`.
    pub fn strided(name: &'static str, data: &'a [T], dims: [usize; 4], strides: [usize; 3]) -> Result<Self> {
        checked_product(name, &dims)?;
        if dims.iter().all(|&d| d > 0) {
            let last = (0..3)
                .try_fold(dims[3] - 1, |acc, i| (dims[i] - 1).checked_mul(strides[i]).and_then(|x| x.checked_add(acc)))
                .ok_or_else(|| AttnError::Layout { tensor: name, reason: "strides overflow".into() })?;
            if last >= data.len() {
                return Err(AttnError::Layout {
                    tensor: name,
                    reason: format!(
                        "strides {:?} with shape {:?} reach element {}, slice has {}",
                        strides,
                        dims,
                        last,
                        data.len()
                    ),
                });
            }
        }
        Ok(Self { data, dims, strides })
    }

    /// `[B, H, L, D]`.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// The contiguous row `[D]` at `(b, h, l)`.
    #[inline]
    pub fn row(&self, b: usize, h: usize, l: usize) -> &'a [T] {
        // A tensor with `D = 0` holds no elements (its slice may be empty at any offset).
        if self.dims[3] == 0 {
            return &[];
        }
        let o = b * self.strides[0] + h * self.strides[1] + l * self.strides[2];
        &self.data[o..o + self.dims[3]]
    }

    /// Element strides of B, H and L.
    pub fn strides(&self) -> [usize; 3] {
        self.strides
    }

    /// The underlying slice.
    pub fn data(&self) -> &'a [T] {
        self.data
    }
}

/// A mask or bias tensor of rank 1 to 4 whose shape broadcasts, right-aligned like PyTorch, to
/// `[B, Hq, Lq, Lk]`. The data is contiguous in its own shape.
#[derive(Debug, Clone, Copy)]
pub struct Broadcast<'a, T> {
    data: &'a [T],
    shape: [usize; 4],
    rank: usize,
}

impl<'a, T> Broadcast<'a, T> {
    /// `shape` has rank 1 to 4; `data.len()` must equal its product.
    pub fn new(name: &'static str, data: &'a [T], shape: &[usize]) -> Result<Self> {
        if shape.is_empty() || shape.len() > 4 {
            return Err(AttnError::Layout { tensor: name, reason: format!("rank {}, expected 1 to 4", shape.len()) });
        }
        let n = checked_product(name, shape)?;
        if data.len() != n {
            return Err(AttnError::Layout {
                tensor: name,
                reason: format!("{} elements for shape {:?}, expected {}", data.len(), shape, n),
            });
        }
        let mut full = [1usize; 4];
        full[4 - shape.len()..].copy_from_slice(shape);
        Ok(Self { data, shape: full, rank: shape.len() })
    }

    /// The shape as given (rank 1 to 4).
    pub fn shape(&self) -> &[usize] {
        &self.shape[4 - self.rank..]
    }

    /// Element strides against `target = [B, Hq, Lq, Lk]`, 0 on broadcast dimensions.
    pub fn strides_for(&self, name: &'static str, target: [usize; 4]) -> Result<[usize; 4]> {
        let mut strides = [0usize; 4];
        let mut acc = 1usize;
        for d in (0..4).rev() {
            let s = self.shape[d];
            if s != 1 && s != target[d] {
                return Err(AttnError::Broadcast { tensor: name, found: self.shape().to_vec(), target });
            }
            strides[d] = if s == 1 { 0 } else { acc };
            acc *= s;
        }
        Ok(strides)
    }

    /// The underlying slice.
    pub fn data(&self) -> &'a [T] {
        self.data
    }
}

/// A broadcast tensor resolved against `[B, Hq, Lq, Lk]`: element `(b, h, i, j)` at
/// `b*s0 + h*s1 + i*s2 + j*s3`.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) strides: [usize; 4],
}

impl<'a, T: Copy> Resolved<'a, T> {
    /// The element at `(b, h, i, j)`.
    #[inline]
    pub fn at(&self, b: usize, h: usize, i: usize, j: usize) -> T {
        let s = self.strides;
        self.data[b * s[0] + h * s[1] + i * s[2] + j * s[3]]
    }

    /// The row `(b, h, i, ·)` as (offset of j = 0, stride along j).
    #[inline]
    pub fn row(&self, b: usize, h: usize, i: usize) -> (&'a [T], usize) {
        let s = self.strides;
        (&self.data[b * s[0] + h * s[1] + i * s[2]..], s[3])
    }
}

fn checked_product(name: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| AttnError::Layout { tensor: name, reason: format!("shape {:?} overflows", dims) })
}
