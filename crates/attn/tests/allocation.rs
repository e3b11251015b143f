//! Buffers sized by the caller's shapes are allocated fallibly: a call whose weights, output or
//! scratch cannot be held returns an error naming the buffer, its shape and the bytes asked for,
//! instead of aborting the process. Inputs here are broadcast views (stride 0) of one element, so
//! the shapes are huge while the tensors hold almost nothing, and every request is larger than any
//! address space: the outcome does not depend on the machine's memory or overcommit settings.

use attn::{sdpa, sdpa_full, AttnLibError, Kernel, SdpaOptions};
use attn_kernels::AttnError;

use candle_core::{Device, Tensor};

/// `[1, 1, len, 1]` of ones, a broadcast view of a single element.
fn broadcast_column(len: usize) -> Tensor {
    Tensor::ones((1, 1, 1, 1), candle_core::DType::F32, &Device::Cpu).unwrap().broadcast_as((1, 1, len, 1)).unwrap()
}

fn alloc_error(e: AttnLibError) -> String {
    assert!(matches!(e, AttnLibError::Kernel(AttnError::Alloc(_))), "not an allocation error: {e:?}");
    e.to_string()
}

#[test]
fn weights_beyond_the_address_space_are_an_error_for_every_kernel() {
    // Weights [1, 1, 2^20, 2^41] f32: 2^63 bytes, more than any allocation may be.
    let (lq, lk) = (1usize << 20, 1usize << 41);
    let (q, kv) = (broadcast_column(lq), broadcast_column(lk));
    for kernel in [Kernel::Reference, Kernel::Auto, Kernel::Flash(attn_kernels::Isa::Portable)] {
        let opts = SdpaOptions::default().kernel(kernel).return_weights(true);
        let text = alloc_error(sdpa_full(&q, &kv, &kv, &opts).unwrap_err());
        assert_eq!(
            text,
            format!("attention weights [1, 1, {lq}, {lk}] f32 need 9.2 EB: more than the address space holds"),
            "{}",
            kernel.name()
        );
    }
}

#[test]
fn weights_whose_byte_count_overflows_are_an_error() {
    // Weights [1, 1, 2^20, 2^43] f32: 2^63 elements, 2^65 bytes.
    let (lq, lk) = (1usize << 20, 1usize << 43);
    let opts = SdpaOptions::default().return_weights(true);
    let text =
        alloc_error(sdpa_full(&broadcast_column(lq), &broadcast_column(lk), &broadcast_column(lk), &opts).unwrap_err());
    assert_eq!(
        text,
        format!("attention weights [1, 1, {lq}, {lk}] f32 need 36.9 EB: more than the address space holds")
    );
}

#[test]
fn packed_keys_beyond_the_address_space_are_an_error() {
    // No weights asked for: the flash kernel's packed keys of one head, 2^61 floats, cannot exist.
    let kv = broadcast_column(1 << 61);
    let text = alloc_error(sdpa(&broadcast_column(1 << 10), &kv, &kv, &SdpaOptions::default()).unwrap_err());
    assert!(text.starts_with("packed keys ["), "{text}");
    assert!(text.ends_with("f32 need 9.2 EB: more than the address space holds"), "{text}");
}

#[test]
fn an_output_beyond_the_address_space_is_an_error() {
    // out [1, 1, 2^61, 1] f32 from one-element inputs.
    let q = broadcast_column(1 << 61);
    let kv = broadcast_column(1);
    let text = alloc_error(sdpa(&q, &kv, &kv, &SdpaOptions::default()).unwrap_err());
    assert_eq!(
        text,
        format!("attention output [1, 1, {}, 1] f32 need 9.2 EB: more than the address space holds", 1usize << 61)
    );
}

#[test]
fn random_tensors_too_large_to_hold_are_an_error() {
    let e = attn::random::uniform(&[1 << 40, 1 << 40], -1.0, 1.0, 1).unwrap_err();
    let want =
        format!("random values [{}, {}] f32 need 4.8 YB: more than the address space holds", 1u64 << 40, 1u64 << 40);
    assert_eq!(alloc_error(e), want);
    let e = attn::random::uniform(&[1 << 31, 1 << 31], -1.0, 1.0, 1).unwrap_err();
    assert_eq!(
        alloc_error(e),
        format!("random values [{}, {}] f32 need 18.4 EB: more than the address space holds", 1u64 << 31, 1u64 << 31)
    );
}
