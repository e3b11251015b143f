//! Golden bfloat16 tests: the flash kernel's bfloat16 products (`Precision::Bf16`) forward and
//! backward on the `bf16_*` fixtures of `scripts/gen_fixtures.py`, whose q, k, v and `grad_out` are
//! bf16 values and which hold, beside PyTorch's float64 results (the oracle), PyTorch's own bf16
//! results (`F.scaled_dot_product_attention` with the math backend on bf16 tensors). The kernel
//! runs on q as f32, K and V as bf16 views, and must pass the oracle rule — factor 2 for `out`, 3
//! for `dq`, `dk`, `dv` and `dbias` — with PyTorch's bf16 error as the baseline. Every flash
//! instruction set runs: AVX-512 with AVX512-BF16 natively (ignored, with the reason, on a CPU
//! without it), the emulation on AVX2 and portable Rust.

use crate::common;
use crate::golden_parts;

use attn_kernels::{attention, attention_backward, AttnParams, Kernel, KvView, Precision, Saved, View4};
use attn_testkit::oracle::{self, GRADIENT_FACTOR, OUTPUT_FACTOR};
use golden_parts::fixture::{fixture_paths, Fixture};
use half::bf16;

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&x| x as f32).collect()
}

/// The fixtures that hold PyTorch's bf16 results.
fn bf16_fixtures() -> Vec<Fixture> {
    let all = fixture_paths().iter().map(|p| Fixture::load(p).unwrap_or_else(|e| panic!("{e}"))).collect::<Vec<_>>();
    let bf: Vec<Fixture> = all.into_iter().filter(|fx| fx.torch_bf16.is_some()).collect();
    assert!(bf.len() >= 4, "expected the four bf16_* fixtures, found {}", bf.len());
    bf
}

/// `kernel` forward and backward with bfloat16 products on `fx`, checked under the oracle rule.
fn check_fixture(kernel: Kernel, fx: &Fixture) -> Result<(), String> {
    let (torch, g) = (fx.torch_bf16.as_ref().unwrap(), fx.grads.as_ref().ok_or(format!("{}: no gradients", fx.file))?);
    let fail = |e: attn_kernels::AttnError| format!("{}: {}: {e}", fx.file, kernel.name());
    let to16 = |x: &[f64]| x.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>();
    let (q, k16, v16) = (to_f32(&fx.q.data), to16(&fx.k.data), to16(&fx.v.data));
    let bias = fx.bias.as_ref().map(|b| to_f32(&b.data));
    let params = AttnParams { compute: Precision::Bf16, ..fx.params(bias.as_deref(), None)? };
    let q = View4::contiguous("q", &q, fx.q.dims4()).map_err(fail)?;
    let k = KvView::Bf16(View4::contiguous("k", &k16, fx.k.dims4()).map_err(fail)?);
    let v = KvView::Bf16(View4::contiguous("v", &v16, fx.v.dims4()).map_err(fail)?);
    let fwd = attention(kernel, &q, &k, &v, &params, false).map_err(fail)?;
    let within = |what: &str, fast: &[f32], r: &[f64], base: &[f64], factor: f64| {
        oracle::check(what, fast, r, &to_f32(base), factor).map_err(|e| format!("{}: {}: {e}", fx.file, kernel.name()))
    };
    within("out", &fwd.out, &fx.out.data, &torch.out.data, OUTPUT_FACTOR)?;
    let dout = to_f32(&g.grad_out.data);
    let dout = View4::contiguous("grad_out", &dout, fx.out.dims4()).map_err(fail)?;
    let saved = Saved::of(&fwd, fx.out.dims4(), dout).map_err(fail)?;
    let grads = attention_backward(kernel, &q, &k, &v, &saved, &params, true).map_err(fail)?;
    within("dq", &grads.dq, &g.dq.data, &torch.dq.data, GRADIENT_FACTOR)?;
    within("dk", &grads.dk, &g.dk.data, &torch.dk.data, GRADIENT_FACTOR)?;
    within("dv", &grads.dv, &g.dv.data, &torch.dv.data, GRADIENT_FACTOR)?;
    match (&grads.dbias, &g.dbias, &torch.dbias) {
        (Some(f), Some(r), Some(b)) => within("dbias", f, &r.data, &b.data, GRADIENT_FACTOR),
        (None, None, None) => Ok(()),
        _ => Err(format!("{}: dbias present in some results only", fx.file)),
    }
}

fn check(kernel: Kernel) {
    let failures: Vec<String> = bf16_fixtures().iter().filter_map(|fx| check_fixture(kernel, fx).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

common::isa_test!([avx512bf16] #[test]
fn native_avx512_bf16() {
    assert!(attn_kernels::Isa::has_avx512_bf16(), "this CPU lacks AVX512-BF16");
    check(Kernel::Flash(attn_kernels::Isa::Avx512))
});

common::isa_test!([avx2] #[test]
fn emulated_avx2() {
    common::assert_available(Kernel::Flash(attn_kernels::Isa::Avx2));
    check(Kernel::Flash(attn_kernels::Isa::Avx2))
});

#[test]
fn emulated_portable() {
    check(Kernel::Flash(attn_kernels::Isa::Portable))
}
