//! File tensors as candle tensors for the `attn` library, and back: floats keep their element
//! type (so `f16`/`bf16` keys and values reach the kernels as stored), boolean masks become `U8`,
//! and results come back as `F32` host tensors. Copies are allocated fallibly.

use attn::alloc::{self, Elem};
use candle_core::{Device, Storage, Tensor, WithDType};

use super::error::IoErrorKind;
use super::tensor::{HostData, HostTensor, BOOLEANS, FLOATS};

impl HostTensor {
    /// A float tensor (F16, BF16, F32 or F64) as a CPU candle tensor of the same shape and type.
    pub fn into_float_tensor(self) -> Result<Tensor, IoErrorKind> {
        let shape = self.shape;
        match self.data {
            HostData::F16(v) => cpu_tensor(v, &shape),
            HostData::Bf16(v) => cpu_tensor(v, &shape),
            HostData::F32(v) => cpu_tensor(v, &shape),
            HostData::F64(v) => cpu_tensor(v, &shape),
            other => Err(IoErrorKind::Dtype { found: other.dtype().name().into(), expected: FLOATS.into() }),
        }
    }

    /// A BOOL or U8 tensor as a CPU `U8` candle tensor of the same shape (non-zero = true).
    pub fn into_mask_tensor(self) -> Result<Tensor, IoErrorKind> {
        let shape = self.shape;
        match self.data {
            HostData::Bool(v) => cpu_tensor(alloc::collect("mask as u8", &shape, v.into_iter().map(u8::from))?, &shape),
            HostData::U8(v) => cpu_tensor(v, &shape),
            other => Err(IoErrorKind::Dtype { found: other.dtype().name().into(), expected: BOOLEANS.into() }),
        }
    }

    /// A `U8` keep-mask candle tensor (such as [`attn::SdpaOptions::keep_mask`]'s) as a BOOL
    /// tensor of the same shape, non-zero = true; `what` names the copy if it cannot be allocated.
    pub fn from_keep_tensor(t: &Tensor, what: &'static str) -> Result<HostTensor, IoErrorKind> {
        let data = tensor_values::<u8>(t, what)?;
        let keep = alloc::collect(what, t.dims(), data.iter().map(|&x| x != 0))?;
        Ok(HostTensor { shape: t.dims().to_vec(), data: HostData::Bool(keep) })
    }

    /// An `F32` candle tensor of any shape, copied to host memory; `what` names the copy if it
    /// cannot be allocated.
    pub fn from_f32_tensor(t: &Tensor, what: &'static str) -> Result<HostTensor, IoErrorKind> {
        Ok(HostTensor { shape: t.dims().to_vec(), data: HostData::F32(tensor_values(t, what)?) })
    }
}

/// The row-major elements of the CPU tensor `t`, whose element type must be `T`, copied into a
/// vector allocated fallibly (`what` names it in the error).
pub fn tensor_values<T: WithDType + Elem>(t: &Tensor, what: &'static str) -> Result<Vec<T>, IoErrorKind> {
    let t = if t.is_contiguous() { t.clone() } else { t.contiguous().map_err(candle_error)? };
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(IoErrorKind::Value(format!("{what}: not on the CPU")));
    };
    let all = cpu.as_slice::<T>().map_err(candle_error)?;
    let values = &all[layout.start_offset()..][..t.elem_count()];
    Ok(alloc::collect(what, t.dims(), values.iter().copied())?)
}

fn cpu_tensor<T: WithDType>(data: Vec<T>, shape: &[usize]) -> Result<Tensor, IoErrorKind> {
    Tensor::from_vec(data, shape, &Device::Cpu).map_err(candle_error)
}

fn candle_error(e: candle_core::Error) -> IoErrorKind {
    IoErrorKind::Value(format!("candle: {e}"))
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn floats_keep_their_type_and_masks_become_u8() {
        let t = HostTensor::new(vec![2, 1], HostData::F16(vec![f16::ONE, f16::NEG_INFINITY])).unwrap();
        let c = t.into_float_tensor().unwrap();
        assert_eq!((c.dims(), c.dtype()), (&[2, 1][..], candle_core::DType::F16));
        let m = HostTensor::new(vec![3], HostData::Bool(vec![true, false, true])).unwrap();
        assert_eq!(m.into_mask_tensor().unwrap().to_vec1::<u8>().unwrap(), [1, 0, 1]);
        let back = HostTensor::from_f32_tensor(&Tensor::new(&[[1.5f32, -2.0]], &Device::Cpu).unwrap(), "out").unwrap();
        assert_eq!(back, HostTensor { shape: vec![1, 2], data: HostData::F32(vec![1.5, -2.0]) });
        let keep = HostTensor::from_keep_tensor(&Tensor::new(&[[0u8], [3]], &Device::Cpu).unwrap(), "mask").unwrap();
        assert_eq!(keep, HostTensor { shape: vec![2, 1], data: HostData::Bool(vec![false, true]) });
    }

    #[test]
    fn wrong_types_are_refused() {
        let ints = || HostTensor::new(vec![1], HostData::I32(vec![3])).unwrap();
        assert_eq!(ints().into_float_tensor().unwrap_err().to_string(), "dtype I32, expected F16, BF16, F32 or F64");
        assert_eq!(ints().into_mask_tensor().unwrap_err().to_string(), "dtype I32, expected BOOL or U8");
        let f64s = Tensor::new(&[1.0f64], &Device::Cpu).unwrap();
        assert!(HostTensor::from_f32_tensor(&f64s, "out").is_err());
        let strided = Tensor::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap().t().unwrap();
        assert_eq!(tensor_values::<f32>(&strided, "out").unwrap(), [1.0, 3.0, 2.0, 4.0]);
    }
}
