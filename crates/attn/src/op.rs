//! The candle plumbing of a differentiable attention call, shared by the dense (`autograd`) and
//! packed (`varlen`) calls: a call is an [`AttnOp`]; its output is the `CustomOp3` [`Output`], and
//! its log-sum-exp and weights are [`SideOutput`]s, `CustomOp3`s over the same three arguments
//! that hand out what the forward kept. Each op's `bwd` runs the call's backward kernel with the
//! gradient that reached that op ([`Arrived`]; the others zero), and candle adds the arguments'
//! gradients up: a loss that reads only the output runs one backward, one that also reads the
//! log-sum-exp or the weights runs one more for each.
//!
//! A forward's failure is kept typed in the call's [`ForwardState`] ([`failed`]), since candle's
//! error would only carry its text.

use std::sync::{Arc, Mutex, MutexGuard};

use attn_kernels::alloc;
use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Storage, Tensor};

use crate::convert::contiguous_f32;
use crate::error::{AttnLibError, Result};

/// What a forward leaves for the caller and the backward.
#[derive(Debug, Default)]
pub(crate) struct ForwardState {
    pub(crate) lse: Vec<f32>,
    /// `lse`'s rounding residue, which makes the backward's probabilities as exact as the forward's.
    pub(crate) lse_residue: Vec<f32>,
    /// The shapes the log-sum-exp and the weights are handed out in.
    pub(crate) lse_shape: Vec<usize>,
    pub(crate) weights_shape: Vec<usize>,
    /// The flash path that scored the keys, which the backward scores them by again.
    pub(crate) path: Option<attn_kernels::Path>,
    /// The weights `[B, Hq, Lq, Lk]`, until [`SideOutput`] hands them out.
    pub(crate) weights: Option<Vec<f32>>,
    /// Why the forward failed, kept typed.
    pub(crate) error: Option<AttnLibError>,
}

/// The gradient that reached one of a call's outputs.
pub(crate) enum Arrived<'a> {
    /// At the output `out`.
    Out { out: &'a Tensor, grad: &'a Tensor },
    /// At the log-sum-exp.
    Lse(&'a Tensor),
    /// At the weights `weights`.
    Weights { weights: &'a Tensor, grad: &'a Tensor },
}

/// What the backward kernels read of the gradient that arrived, all contiguous f32.
pub(crate) struct Incoming {
    /// The output and its gradient; zeros when the gradient arrived at a side output (`dO = 0`,
    /// so `Δ = dO·O = 0` whatever `O` is).
    pub(crate) out: Tensor,
    pub(crate) dout: Tensor,
    /// The log-sum-exp's gradient, flat.
    pub(crate) dlse: Option<Vec<f32>>,
    /// The weights and their gradient.
    pub(crate) dweights: Option<[Tensor; 2]>,
}

impl Arrived<'_> {
    /// The gradient in the kernels' form, for an output of `out_shape`.
    pub(crate) fn incoming(self, out_shape: &[usize], device: &Device) -> Result<Incoming> {
        let zeros = || -> Result<Tensor> {
            let z = alloc::filled("zero output gradient", out_shape, 0.0f32)?;
            Ok(Tensor::from_vec(z, out_shape, device)?)
        };
        Ok(match self {
            Arrived::Out { out, grad } => {
                Incoming { out: out.clone(), dout: contiguous_f32(grad)?, dlse: None, dweights: None }
            }
            Arrived::Lse(grad) => {
                let z = zeros()?;
                let dlse = Some(contiguous_f32(grad)?.flatten_all()?.to_vec1::<f32>()?);
                Incoming { out: z.clone(), dout: z, dlse, dweights: None }
            }
            Arrived::Weights { weights, grad } => {
                let z = zeros()?;
                let dweights = Some([contiguous_f32(weights)?, contiguous_f32(grad)?]);
                Incoming { out: z.clone(), dout: z, dlse: None, dweights }
            }
        })
    }
}

/// One differentiable attention call.
pub(crate) trait AttnOp: Send + Sync + 'static {
    /// The candle op's name.
    fn name(&self) -> &'static str;
    /// Runs the forward kernel on the three arguments: the output's storage and shape, the rest
    /// kept in the returned state.
    fn forward(&self, args: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, Shape, ForwardState)>;
    /// The three arguments' gradients from the one that `arrived`.
    fn backward(&self, args: [&Tensor; 3], arrived: Arrived) -> Result<[Option<Tensor>; 3]>;
    /// Where the forward's state is kept.
    fn state(&self) -> &Mutex<ForwardState>;
}

/// A call's three outputs: `out` and the log-sum-exp (differentiable when the arguments are), and
/// the weights when the forward made them.
pub(crate) struct Outputs {
    pub(crate) out: Tensor,
    pub(crate) lse: Tensor,
    pub(crate) weights: Option<Tensor>,
}

/// Runs `op` on `args`: its outputs, or the typed error its forward kept.
pub(crate) fn apply<B: AttnOp>(args: [&Tensor; 3], op: B) -> Result<Outputs> {
    let op = Arc::new(op);
    let on = |c: Box<dyn CustomOp3 + Send + Sync>| -> Result<Tensor> {
        let t = args[0].apply_op3_arc(args[1], args[2], Arc::new(c));
        match lock(op.state()).error.take() {
            Some(e) => Err(e),
            None => Ok(t?),
        }
    };
    let out = on(Box::new(Output(op.clone())))?;
    let side = |which| on(Box::new(SideOutput { op: op.clone(), which }));
    let lse = side(Side::Lse)?;
    let made_weights = lock(op.state()).weights.is_some();
    let weights = if made_weights { Some(side(Side::Weights)?) } else { None };
    Ok(Outputs { out, lse, weights })
}

/// Applies the single-output `op` to `(a1, a2, a3)`: its output and the state its forward left in
/// `saved`, or the typed error that forward kept there ([`failed`]).
pub(crate) fn apply_op<'s>(
    a1: &Tensor,
    a2: &Tensor,
    a3: &Tensor,
    op: impl CustomOp3 + Send + Sync + 'static,
    saved: &'s Mutex<ForwardState>,
) -> Result<(Tensor, MutexGuard<'s, ForwardState>)> {
    let out = a1.apply_op3_arc(a2, a3, Arc::new(Box::new(op)));
    let mut s = lock(saved);
    match s.error.take() {
        Some(e) => Err(e),
        None => Ok((out?, s)),
    }
}

/// Keys and values joined along their last dimension into one argument (`[.., Dk + Dv]`, in `k`'s
/// dtype), for an op whose third argument carries the tracked extras (bias, sinks, table).
/// Contiguous: candle joins strided tensors along their last dimension into a transposed layout,
/// which the kernels' views (last dimension contiguous) cannot read.
pub(crate) fn join_kv(k: &Tensor, v: &Tensor) -> Result<Tensor> {
    Ok(Tensor::cat(&[k, &v.to_dtype(k.dtype())?], k.rank() - 1)?.contiguous()?)
}

/// The layouts of the keys (the first `dk` columns) and the values inside a [`join_kv`] argument
/// laid out as `l`.
pub(crate) fn split_kv(l: &Layout, dk: usize) -> Result<[Layout; 2]> {
    let last = l.dims().len() - 1;
    let dv = l.dims()[last] - dk;
    Ok([l.clone().narrow(last, 0, dk)?, l.clone().narrow(last, dk, dv)?])
}

/// How an op's arguments hold the keys, the values and the tensors whose gradient only the third
/// argument can carry (a custom op takes at most three): `(q, k, v)`, or `(q, [k | v], extra)`
/// with `Dk` columns of keys ([`join_kv`]) and `extra` the tracked ones of the bias, the sinks and
/// the score modification's table, flattened and joined in that order (one alone as it is).
/// This type owns that order: [`Args::new`] joins, [`Args::extra_grad`] splits back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Args {
    /// `(q, k, v)`.
    Separate,
    /// `(q, [k | v], extra)`; which of the bias, the sinks and the table `extra` holds.
    Packed { dk: usize, bias: bool, sinks: bool, table: bool },
}

impl Args {
    /// The arguments after `q` for keys `k`, values `v` and the tracked `[bias, sinks, table]`.
    pub(crate) fn new(k: &Tensor, v: &Tensor, tracked: [Option<&Tensor>; 3]) -> Result<(Args, Tensor, Tensor)> {
        let parts: Vec<&Tensor> = tracked.into_iter().flatten().collect();
        let extra = match parts.as_slice() {
            [] => return Ok((Args::Separate, k.clone(), v.clone())),
            [one] => (*one).clone(),
            _ => {
                let flat = parts.iter().map(|t| t.flatten_all()?.to_dtype(candle_core::DType::F32));
                Tensor::cat(&flat.collect::<candle_core::Result<Vec<_>>>()?, 0)?
            }
        };
        let [bias, sinks, table] = tracked.map(|t| t.is_some());
        let dk = k.dims()[k.rank() - 1];
        Ok((Args::Packed { dk, bias, sinks, table }, join_kv(k, v)?, extra))
    }

    /// Whether the bias takes a gradient through the op.
    pub(crate) fn bias(self) -> bool {
        matches!(self, Args::Packed { bias: true, .. })
    }

    /// The keys' and the values' storage and layout inside arguments 2 and 3.
    pub(crate) fn kv_parts<'a>(
        self,
        (s2, l2): (&'a CpuStorage, &Layout),
        (s3, l3): (&'a CpuStorage, &Layout),
    ) -> Result<[(&'a CpuStorage, Layout); 2]> {
        match self {
            Args::Separate => Ok([(s2, l2.clone()), (s3, l3.clone())]),
            Args::Packed { dk, .. } => {
                let [k, v] = split_kv(l2, dk)?;
                Ok([(s2, k), (s2, v)])
            }
        }
    }

    /// `Dv` of arguments 2 and 3.
    pub(crate) fn dv(self, a2: &Tensor, a3: &Tensor) -> usize {
        let last = |t: &Tensor| t.dims()[t.rank() - 1];
        match self {
            Args::Separate => last(a3),
            Args::Packed { dk, .. } => last(a2) - dk,
        }
    }

    /// The gradients of arguments 2 and 3 from those of the keys and values and of the kernels'
    /// `[dbias, dsinks, dtable]` (flat), in the arguments' dtypes and shapes.
    pub(crate) fn grads(
        self,
        [a2, a3]: [&Tensor; 2],
        [dk, dv]: [Tensor; 2],
        extra: [Option<Vec<f32>>; 3],
    ) -> Result<[Option<Tensor>; 2]> {
        let Args::Packed { bias, sinks, table, .. } = self else {
            return Ok([Some(dk.to_dtype(a2.dtype())?), Some(dv.to_dtype(a3.dtype())?)]);
        };
        let dkv = join_kv(&dk, &dv)?.to_dtype(a2.dtype())?;
        let mut joined = Vec::with_capacity(a3.elem_count());
        let fields = ["bias", "sinks", "score_table"];
        for ((part, wanted), field) in extra.into_iter().zip([bias, sinks, table]).zip(fields) {
            if !wanted {
                continue;
            }
            let part = part.ok_or_else(|| AttnLibError::Value {
                field,
                reason: "the backward kernel gave no gradient for it".into(),
            })?;
            joined.extend(part);
        }
        let dextra = Tensor::from_vec(joined, a3.dims(), a3.device())?.to_dtype(a3.dtype())?;
        Ok([Some(dkv), Some(dextra)])
    }
}

/// The state, whether or not a panicking thread poisoned its lock.
pub(crate) fn lock(m: &Mutex<ForwardState>) -> MutexGuard<'_, ForwardState> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// candle's error for a forward that failed with `e`, which is kept typed in `saved` for the
/// caller to return.
pub(crate) fn failed(saved: &Mutex<ForwardState>, e: AttnLibError) -> candle_core::Error {
    let text = e.to_string();
    lock(saved).error = Some(e);
    candle_core::Error::Msg(text)
}

/// A copy of the log-sum-exp the op keeps, allocated fallibly.
pub(crate) fn copy_lse(lse: &[f32]) -> Result<Vec<f32>> {
    Ok(alloc::collect("log-sum-exp", &[lse.len()], lse.iter().copied())?)
}

/// The CPU storage of a tensor the op received.
pub(crate) fn cpu(s: &Storage) -> Result<&CpuStorage> {
    match s {
        Storage::Cpu(c) => Ok(c),
        _ => Err(AttnLibError::Device { tensor: "q", found: "not the CPU".into() }),
    }
}

type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

fn grads3<B: AttnOp>(op: &B, args: [&Tensor; 3], arrived: Arrived) -> candle_core::Result<Grads3> {
    let [a, b, c] = op.backward(args, arrived).map_err(candle_core::Error::wrap)?;
    Ok((a, b, c))
}

/// A call's output.
struct Output<B>(Arc<B>);

impl<B: AttnOp> CustomOp3 for Output<B> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match self.0.forward([(s1, l1), (s2, l2), (s3, l3)]) {
            Ok((out, shape, state)) => {
                *lock(self.0.state()) = state;
                Ok((out, shape))
            }
            Err(e) => Err(failed(self.0.state(), e)),
        }
    }

    fn bwd(&self, a1: &Tensor, a2: &Tensor, a3: &Tensor, out: &Tensor, grad: &Tensor) -> candle_core::Result<Grads3> {
        grads3(&*self.0, [a1, a2, a3], Arrived::Out { out, grad })
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Lse,
    Weights,
}

/// A call's log-sum-exp or weights, as its forward kept them.
struct SideOutput<B> {
    op: Arc<B>,
    which: Side,
}

impl<B: AttnOp> CustomOp3 for SideOutput<B> {
    fn name(&self) -> &'static str {
        match self.which {
            Side::Lse => "attn-lse",
            Side::Weights => "attn-weights",
        }
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let mut s = lock(self.op.state());
        let made = match self.which {
            Side::Lse => copy_lse(&s.lse).map(|lse| (lse, s.lse_shape.clone())),
            Side::Weights => Ok((s.weights.take().unwrap_or_default(), s.weights_shape.clone())),
        };
        drop(s);
        let (data, shape) = made.map_err(|e| failed(self.op.state(), e))?;
        Ok((CpuStorage::F32(data), Shape::from(shape)))
    }

    fn bwd(&self, a1: &Tensor, a2: &Tensor, a3: &Tensor, res: &Tensor, grad: &Tensor) -> candle_core::Result<Grads3> {
        let arrived = match self.which {
            Side::Lse => Arrived::Lse(grad),
            Side::Weights => Arrived::Weights { weights: res, grad },
        };
        grads3(&*self.op, [a1, a2, a3], arrived)
    }
}
