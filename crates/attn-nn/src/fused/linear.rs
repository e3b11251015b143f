//! `x·weightᵀ + bias` over the last dimension as one `CustomOp3` on `(x, weight, bias)`, the
//! leading dimensions of `x` folded into rows. candle's own composition (reshape, transpose,
//! matmul, bias, reshape) is five nodes of the autograd graph, and candle's backward accumulates
//! each node's gradient into a fresh zero tensor with one more pass: four passes over the
//! activations per layer where this op has one. The forward repeats the bias into the output rows
//! and adds the product there (`gemm` with `read_dst`); the backward makes `dx = dy·weight`,
//! `dweight = dyᵀ·x` and `dbias = Σ_rows dy`, each only when its argument is tracked (a constant
//! input gets no gradient and costs no product). The products are the `gemm` crate's, as candle's
//! are, on the current rayon pool's threads — but for a few input rows (decode steps), a product
//! of this module's own that streams the weights once for all of them.

use attn_kernels::bf16_weights::Bf16Weights;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, WithDType};
use gemm::{gemm, Parallelism};

use super::{column_sums, contiguous, prepared, with_values};

/// `x: [.., in]`, `weight: [out, in]`, `bias: [out]` (zero when `None`) → `[.., out]`;
/// differentiable in all three. Other dtypes than `f32`, `f64` are computed in `f32` and the
/// result cast back to `x`'s.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let dtype = x.dtype();
    let x = prepared(x)?;
    let weight = prepared(weight)?.to_dtype(x.dtype())?;
    let out = weight.dim(0)?;
    let bias = match bias {
        Some(b) => prepared(b)?.to_dtype(x.dtype())?,
        None => Tensor::zeros(out, x.dtype(), x.device())?,
    };
    x.apply_op3(&weight, &bias, LinearOp)?.to_dtype(dtype)
}

struct LinearOp;

/// The element types the products here run in.
trait Real: WithDType {
    /// [`few_rows`]' dot products of a run of weight rows with the input rows.
    fn row_dots(w: &[Self], x: &[Self], inn: usize, out: &mut [Self]);
}
impl Real for f32 {
    /// On the kernels' SIMD layer (fused multiply-adds on the CPU's widest vectors).
    fn row_dots(w: &[f32], x: &[f32], inn: usize, out: &mut [f32]) {
        attn_kernels::rows::weight_row_dots(w, x, inn, out)
    }
}
impl Real for f64 {
    fn row_dots(w: &[f64], x: &[f64], inn: usize, out: &mut [f64]) {
        row_dots_portable(w, x, inn, out)
    }
}

/// A matrix read from `data` with row stride `rs` and column stride `cs` (elements).
#[derive(Clone, Copy)]
struct Mat<'a, T> {
    data: &'a [T],
    rs: usize,
    cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// `[rows, n]` stored row-major.
    fn rows(data: &'a [T], n: usize) -> Self {
        Self { data, rs: n, cs: 1 }
    }

    /// The transpose of `[rows, n]` stored row-major: `[n, rows]`.
    fn transposed(data: &'a [T], n: usize) -> Self {
        Self { data, rs: 1, cs: n }
    }

    /// Whether every element of a `rows × cols` matrix read this way lies inside `data`.
    fn holds(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst [m, n] (row-major) = keep·dst + lhs [m, k] · rhs [k, n]`, `keep` 0 (dst is only written)
/// or 1.
fn product<T: Real>(dst: &mut [T], (m, n, k): (usize, usize, usize), lhs: Mat<T>, rhs: Mat<T>, keep: bool) {
    assert!(
        dst.len() == m * n && lhs.holds(m, k) && rhs.holds(k, n),
        "product: operands too short for [{m}, {k}]·[{k}, {n}]"
    );
    let threads = rayon::current_num_threads();
    let par = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // SAFETY: checked above: `dst` holds the `m·n` elements of row stride `n` and column stride 1
    // that gemm writes, and every element gemm reads of `lhs` (`m × k`) and `rhs` (`k × n`) at
    // their strides lies inside their slices. `dst` is borrowed mutably, so it aliases neither.
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            keep,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// `x: [rows·in]`, `w: [out·in]`, `b: [out]` → `[rows·out]`.
fn forward<T: Real>(x: &[T], w: &[T], b: &[T], (rows, inn): (usize, usize)) -> Vec<T> {
    let out = b.len();
    let mut y = b.repeat(rows); // [rows, out], each row the bias
    if out > 0 && (1..=FEW_ROWS).contains(&rows) {
        few_rows(&mut y, x, w, (rows, inn));
    } else if out > 0 {
        product(&mut y, (rows, out, inn), Mat::rows(x, inn), Mat::transposed(w, inn), true);
    }
    y
}

/// Up to this many input rows (decode steps of a small batch) take [`few_rows`].
const FEW_ROWS: usize = attn_kernels::rows::MAX_ROWS;

/// `y[r, o] += w[o, :]·x[r, :]` for `w: [out, in]` row-major and a few rows `x: [rows, in]`: where
/// `gemm`'s general path reads the weights at well under the memory's speed. Each weight row is
/// read once, in order, by one thread, and dotted with every input row while it is in cache;
/// sixteen partial sums keep the adds independent.
fn few_rows<T: Real>(y: &mut [T], x: &[T], w: &[T], (rows, inn): (usize, usize)) {
    use rayon::prelude::*;
    let out = y.len() / rows;
    assert!(x.len() == rows * inn && w.len() == out * inn, "few_rows: weight of {} for [{out}, {inn}]", w.len());
    if inn == 0 {
        return; // every dot product is empty
    }
    // Outputs per task: enough to amortise a task, few enough to share them among the threads.
    let per_task = (out / (4 * rayon::current_num_threads())).clamp(16, 1024);
    // Computed as [out, rows] (each task a run of weight rows), then added into y's [rows, out].
    let mut transposed = vec![T::zero(); out * rows];
    transposed.par_chunks_mut(per_task * rows).enumerate().for_each(|(c, part)| {
        let n = part.len() / rows;
        T::row_dots(&w[c * per_task * inn..][..n * inn], x, inn, part);
    });
    for (o, ys) in transposed.chunks_exact(rows).enumerate() {
        for (r, &v) in ys.iter().enumerate() {
            y[r * out + o] += v;
        }
    }
}

/// `out[o, r] = w[o, :]·x[r, :]` (`w: [n, inn]`, `x: [rows, inn]`, `out: [n, rows]`) in plain
/// Rust: sixteen partial sums keep the adds independent.
fn row_dots_portable<T: WithDType>(w: &[T], x: &[T], inn: usize, out: &mut [T]) {
    const LANES: usize = 16;
    let rows = x.len() / inn;
    let dot = |row: &[T], xs: &[T]| -> T {
        let mut acc = [T::zero(); LANES];
        for (r, v) in row.chunks_exact(LANES).zip(xs.chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] += r[l] * v[l];
            }
        }
        let tail = (inn - inn % LANES..inn).fold(T::zero(), |s, i| s + row[i] * xs[i]);
        acc.iter().fold(tail, |s, &a| s + a)
    };
    for (row, ys) in w.chunks_exact(inn).zip(out.chunks_exact_mut(rows)) {
        for (r, yr) in ys.iter_mut().enumerate() {
            *yr = dot(row, &x[r * inn..(r + 1) * inn]);
        }
    }
}

/// A gradient shaped like `arg`, when `arg` is tracked: `[m, n]` made by `product` from `lhs` and
/// the values of `with` as `rhs`.
fn product_grad<T: Real>(
    arg: &Tensor,
    (m, n, k): (usize, usize, usize),
    lhs: Mat<T>,
    with: &Tensor,
    rhs: impl FnOnce(&[T]) -> Mat<T>,
) -> Result<Option<Tensor>> {
    if !arg.track_op() {
        return Ok(None);
    }
    let mut grad = vec![T::zero(); m * n];
    with_values::<T, _>(with, |vals| {
        product(&mut grad, (m, n, k), lhs, rhs(vals), false);
        Ok(())
    })?;
    Ok(Some(Tensor::from_vec(grad, arg.shape(), arg.device())?))
}

/// The gradients the tracked arguments need, from `dy: [rows·out]`: `dx = dy·w`, `dw = dyᵀ·x`,
/// `db = Σ_rows dy`, with `w_values` the weight the forward multiplied (`w` itself, or its
/// bfloat16 rounding).
fn backward<T: Real>(
    x: &Tensor,
    (w, w_values): (&Tensor, &Tensor),
    b: &Tensor,
    dy: &Tensor,
) -> Result<[Option<Tensor>; 3]> {
    let dy = dy.to_dtype(T::DTYPE)?.contiguous()?;
    let (out, inn) = w.dims2()?;
    let rows = x.dims()[..x.rank() - 1].iter().product::<usize>();
    with_values::<T, _>(&dy, |dys| {
        let dx = product_grad(x, (rows, inn, out), Mat::rows(dys, out), w_values, |ws| Mat::rows(ws, inn))?;
        let dw = product_grad(w, (out, inn, rows), Mat::transposed(dys, out), x, |xs| Mat::rows(xs, inn))?;
        let db = match b.track_op() {
            true => Some(Tensor::from_vec(column_sums(dys, out), out, b.device())?),
            false => None,
        };
        Ok([dx, dw, db])
    })
}

/// The leading dimensions of `x` and the input width, after checking `x: [.., in]` against
/// `weight: [out, in]` and `bias: [out]`.
fn checked_dims<'a>(x: &'a Layout, w: &Layout, b: &Layout) -> Result<(&'a [usize], usize)> {
    let (out, inn) = w.shape().dims2()?;
    let Some((&x_in, lead)) = x.dims().split_last() else {
        return Err(candle_core::Error::Msg(format!("linear: input of shape {:?} has no feature dimension", x.dims())));
    };
    if x_in != inn || b.dims() != [out] {
        return Err(candle_core::Error::Msg(format!(
            "linear: input {:?} against weight [{out}, {inn}] and bias {:?}: expected [.., {inn}] and [{out}]",
            x.dims(),
            b.dims()
        )));
    }
    Ok((lead, inn))
}

/// [`linear`] with `weight`'s products in bfloat16 through `packed` (`weight` packed by
/// [`Bf16Weights::pack`]): `x` rounded to bfloat16 as it comes, the sums in f32, at twice the f32
/// rate on CPUs with AVX512-BF16 and half the weight's bytes everywhere. Differentiable in all
/// three as the product with the rounded weight (the input's rounding passed straight through:
/// `dx = dy·bf16(weight)`, `dweight = dyᵀ·x`).
pub fn linear_bf16(x: &Tensor, weight: &Tensor, packed: &Bf16Weights, bias: Option<&Tensor>) -> Result<Tensor> {
    let dtype = x.dtype();
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let weight = weight.to_dtype(DType::F32)?;
    if weight.dims() != [packed.out_dim(), packed.in_dim()] {
        candle_core::bail!(
            "linear: weight {:?} against its bfloat16 form [{}, {}]",
            weight.dims(),
            packed.out_dim(),
            packed.in_dim()
        );
    }
    let bias = match bias {
        Some(b) => b.to_dtype(DType::F32)?.contiguous()?,
        None => Tensor::zeros(packed.out_dim(), DType::F32, x.device())?,
    };
    x.apply_op3(&weight, &bias, Bf16LinearOp(packed.clone()))?.to_dtype(dtype)
}

struct Bf16LinearOp(Bf16Weights);

impl CustomOp3 for Bf16LinearOp {
    fn name(&self) -> &'static str {
        "linear-bf16"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _weight: &CpuStorage, // the products read the packed form
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (lead, _) = checked_dims(l1, l2, l3)?;
        let (x, bias) = (contiguous::<f32>(s1, l1)?, contiguous::<f32>(s3, l3)?);
        let mut y = vec![0.0f32; lead.iter().product::<usize>() * self.0.out_dim()];
        self.0.matmul(x, Some(bias), &mut y).map_err(|e| candle_core::Error::Msg(format!("linear: {e}")))?;
        Ok((CpuStorage::F32(y), [lead, &[self.0.out_dim()]].concat().into()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let rounded = Tensor::from_vec(self.0.widened(), w.shape(), w.device())?;
        let [dx, dw, db] = backward::<f32>(x, (w, &rounded), b, dy)?;
        Ok((dx, dw, db))
    }
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (lead, inn) = checked_dims(l1, l2, l3)?;
        // `linear` gave weight and bias the input's dtype; `contiguous` refuses any other.
        let y = per_float!(s1, "linear", |T| contiguous::<T>(s1, l1).and_then(|x| Ok(forward(
            x,
            contiguous(s2, l2)?,
            contiguous(s3, l3)?,
            (lead.iter().product(), inn)
        ))));
        Ok((y, [lead, &[l3.dims()[0]]].concat().into()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let [dx, dw, db] = match x.dtype() {
            DType::F64 => backward::<f64>(x, (w, w), b, dy)?,
            _ => backward::<f32>(x, (w, w), b, dy)?,
        };
        Ok((dx, dw, db))
    }
}
