//! The `.npy` reader and writer: one test per malformed-file case (each asserting the message
//! names the problem), headers as NumPy writes them in versions 1.0, 2.0 and 3.0, write→read
//! round trips, and property tests that random or mutated bytes never panic.

use attn_cli::io::{checked_numel, parse_npy, read_npy, write_npy, HostData, HostTensor};
use half::{bf16, f16};
use proptest::prelude::*;

const FILE: &str = "x.npy";

/// A `.npy` file of `version` with `header` (padded like NumPy) and `data`.
fn npy(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let prefix = if version == 1 { 10 } else { 12 };
    let padded = (prefix + header.len() + 1).next_multiple_of(64) - prefix;
    let h = format!("{header}{}\n", " ".repeat(padded - header.len() - 1));
    let mut b = b"\x93NUMPY".to_vec();
    b.extend([version, 0]);
    if version == 1 {
        b.extend((h.len() as u16).to_le_bytes());
    } else {
        b.extend((h.len() as u32).to_le_bytes());
    }
    b.extend(h.as_bytes());
    b.extend(data);
    b
}

fn dict(descr: &str, fortran: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}")
}

fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn error(bytes: &[u8]) -> String {
    let e = parse_npy(FILE, bytes).expect_err("malformed file accepted").to_string();
    assert!(e.starts_with("x.npy: "), "message does not name the file: {e}");
    assert!(!e.contains('\n'), "message is not one line: {e}");
    e
}

#[test]
fn shorter_than_prefix() {
    let e = error(b"\x93NUMPY\x01");
    assert!(e.contains("7 bytes") && e.contains("too short"), "{e}");
}

#[test]
fn wrong_magic() {
    let mut b = npy(1, &dict("<f4", "False", "(1,)"), &[0; 4]);
    b[1] = b'n';
    assert!(error(&b).contains("magic"));
}

#[test]
fn unknown_version() {
    let mut b = npy(1, &dict("<f4", "False", "(1,)"), &[0; 4]);
    b[6] = 4;
    assert!(error(&b).contains("unsupported .npy version 4.0"));
}

#[test]
fn version_2_prefix_truncated() {
    let e = error(b"\x93NUMPY\x02\x00\x10\x00");
    assert!(e.contains("10 bytes") && e.contains("12 bytes"), "{e}");
}

#[test]
fn header_length_beyond_file() {
    let mut b = b"\x93NUMPY\x02\x00".to_vec();
    b.extend(99999u32.to_le_bytes());
    b.extend([b' '; 108]);
    let e = error(&b);
    assert!(e.contains("header length 99999 exceeds file size 120"), "{e}");
}

#[test]
fn header_not_utf8() {
    let mut b = b"\x93NUMPY\x01\x00\x02\x00".to_vec();
    b.extend([0xc3, 0x28]);
    assert!(error(&b).contains("not UTF-8"));
}

#[test]
fn header_not_a_dict() {
    let e = error(&npy(1, "[1, 2]", &[]));
    assert!(e.contains("malformed header") && e.contains("expected '{'"), "{e}");
}

#[test]
fn header_missing_shape() {
    let e = error(&npy(1, "{'descr': '<f4', 'fortran_order': False}", &[0; 4]));
    assert!(e.contains("key 'shape' missing"), "{e}");
}

#[test]
fn header_unknown_key() {
    let e = error(&npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': True}", &[0; 4]));
    assert!(e.contains("unknown key 'x'"), "{e}");
}

#[test]
fn header_duplicate_key() {
    let e = error(&npy(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", &[0; 4]));
    assert!(e.contains("key 'descr' given twice"), "{e}");
}

#[test]
fn header_wrong_value_kind() {
    let e = error(&npy(1, "{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}", &[0; 4]));
    assert!(e.contains("key 'fortran_order' must be True or False"), "{e}");
}

#[test]
fn header_text_after_dict() {
    let e = error(&npy(1, &format!("{} x", dict("<f4", "False", "(1,)")), &[0; 4]));
    assert!(e.contains("unexpected text after the dict"), "{e}");
}

#[test]
fn big_endian_refused() {
    let e = error(&npy(1, &dict(">f4", "False", "(1,)"), &[0; 4]));
    assert!(e.contains("'>f4' (big-endian)") && e.contains("'<f4'"), "{e}");
}

#[test]
fn object_array_refused() {
    let e = error(&npy(1, &dict("|O", "False", "(1,)"), &[0; 8]));
    assert!(e.contains("'|O' (object array)"), "{e}");
}

#[test]
fn structured_dtype_refused() {
    let e = error(&npy(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", &[0; 4]));
    assert!(e.contains("structured"), "{e}");
}

#[test]
fn unsupported_dtype() {
    let e = error(&npy(1, &dict("<c8", "False", "(1,)"), &[0; 8]));
    assert!(e.contains("dtype '<c8', expected one of"), "{e}");
}

#[test]
fn fortran_order_refused() {
    let e = error(&npy(1, &dict("<f4", "True", "(2, 2)"), &[0; 16]));
    assert!(e.contains("fortran_order is True"), "{e}");
}

#[test]
fn shape_product_overflows() {
    let e = error(&npy(1, &dict("|u1", "False", &format!("({0}, {0}, 2)", 1u64 << 32)), &[]));
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn byte_size_overflows() {
    let e = error(&npy(1, &dict("<f8", "False", &format!("({},)", 1u64 << 62)), &[]));
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn dimension_too_large_for_integer() {
    let e = error(&npy(1, &dict("<f4", "False", "(99999999999999999999999,)"), &[]));
    assert!(e.contains("does not fit in 64 bits"), "{e}");
}

#[test]
fn negative_dimension() {
    let e = error(&npy(1, &dict("<f4", "False", "(-1,)"), &[]));
    assert!(e.contains("expected a non-negative integer"), "{e}");
}

#[test]
fn data_too_short() {
    let e = error(&npy(1, &dict("<f4", "False", "(2, 3)"), &[0; 20]));
    assert!(e.contains("shape [2, 3] of F32 needs 24 bytes, found 20"), "{e}");
}

#[test]
fn data_too_long() {
    let e = error(&npy(1, &dict("<i4", "False", "(1,)"), &[0; 5]));
    assert!(e.contains("needs 4 bytes, found 5"), "{e}");
}

#[test]
fn boolean_byte_not_0_or_1() {
    let e = error(&npy(1, &dict("|b1", "False", "(2,)"), &[1, 7]));
    assert!(e.contains("element 1 is stored as byte 7"), "{e}");
}

#[test]
fn reads_every_version() {
    let data = f32_bytes(&[1.0, -2.5, 3.0, 0.0, 7.0, 1e-3]);
    for version in [1, 2, 3] {
        let t = parse_npy(FILE, &npy(version, &dict("<f4", "False", "(2, 3)"), &data)).unwrap();
        assert_eq!(t.shape, vec![2, 3], "version {version}");
        assert_eq!(t.data, HostData::F32(vec![1.0, -2.5, 3.0, 0.0, 7.0, 1e-3]));
    }
}

#[test]
fn reads_scalars_vectors_and_old_long_suffix() {
    let t = parse_npy(FILE, &npy(1, &dict("<f8", "False", "()"), &2.5f64.to_le_bytes())).unwrap();
    assert_eq!(t, HostTensor { shape: vec![], data: HostData::F64(vec![2.5]) });
    let t = parse_npy(
        FILE,
        &npy(1, &dict("<i8", "False", "(2L,)"), &[3, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 255]),
    )
    .unwrap();
    assert_eq!(t, HostTensor { shape: vec![2], data: HostData::I64(vec![3, -1]) });
    let t = parse_npy(FILE, &npy(1, "{\"descr\": \"|u1\", \"shape\": (0, 4), \"fortran_order\": False}", &[])).unwrap();
    assert_eq!(t, HostTensor { shape: vec![0, 4], data: HostData::U8(vec![]) });
}

fn npy_samples() -> Vec<HostTensor> {
    let t = |shape: Vec<usize>, data| HostTensor::new(shape, data).unwrap();
    vec![
        t(vec![2, 2], HostData::F16(vec![f16::from_f32(0.5), f16::NAN, f16::MAX, f16::ZERO])),
        t(vec![3], HostData::F32(vec![1.0, f32::INFINITY, -0.0])),
        t(vec![], HostData::F64(vec![-1e300])),
        t(vec![1, 2, 1], HostData::Bool(vec![false, true])),
        t(vec![0], HostData::U8(vec![])),
        t(vec![2], HostData::I32(vec![-3, 9])),
        t(vec![1], HostData::I64(vec![i64::MIN])),
    ]
}

#[test]
fn round_trip_every_npy_dtype() {
    let dir = tempfile::tempdir().unwrap();
    for (i, t) in npy_samples().into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.npy"));
        write_npy(&path, &t).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0, "header not aligned like NumPy's");
        assert_eq!(bytes[9 + header_len], b'\n');
        let back = read_npy(&path).unwrap();
        // NaN != NaN, so compare the stored bytes as well as the shapes.
        assert_eq!(back.shape, t.shape);
        assert_eq!(back.data.to_le_bytes(), t.data.to_le_bytes());
        assert_eq!(back.data.dtype(), t.data.dtype());
    }
}

#[test]
fn write_refuses_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let t = HostTensor::new(vec![1], HostData::Bf16(vec![bf16::ONE])).unwrap();
    let e = write_npy(&dir.path().join("b.npy"), &t).unwrap_err().to_string();
    assert!(e.contains("dtype BF16"), "{e}");
}

#[test]
fn file_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let e = read_npy(&dir.path().join("none.npy")).unwrap_err().to_string();
    assert!(e.contains("none.npy") && e.contains("cannot read"), "{e}");
    let short = dir.path().join("short.npy");
    std::fs::write(&short, b"\x93NU").unwrap();
    let e = read_npy(&short).unwrap_err().to_string();
    assert!(e.contains("short.npy") && e.contains("3 bytes"), "{e}");
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_npy(FILE, &bytes);
    }

    #[test]
    fn random_headers_never_panic(header in "\\{['a-z0-9<|:,() TrueFals_]{0,80}\\}", data in proptest::collection::vec(any::<u8>(), 0..32)) {
        let _ = parse_npy(FILE, &npy(1, &header, &data));
    }

    #[test]
    fn mutated_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = npy(1, &dict("<f4", "False", "(2, 1)"), &f32_bytes(&[1.0, 2.0]));
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        if let Ok(t) = parse_npy(FILE, &bytes) {
            prop_assert_eq!(checked_numel(&t.shape).ok(), Some(t.numel()));
        }
    }
}
