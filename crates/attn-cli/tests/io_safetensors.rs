//! The safetensors reader: one test per malformed-file case (each asserting the message names the
//! problem), decoding of files written by the `safetensors` crate, write→read round trips, and
//! property tests that random or mutated bytes give `Ok` or `Err`, never a panic, and that every
//! file this reader accepts the `safetensors` crate accepts with the same tensors.

use std::collections::HashMap;

use attn_cli::io::{
    parse_safetensors, read_safetensors, write_safetensors, DType, HostData, HostTensor, IoErrorKind, MAX_HEADER,
};
use half::{bf16, f16};
use proptest::prelude::*;
use safetensors::{Dtype, SafeTensors};

const FILE: &str = "t.safetensors";

/// A safetensors file from a header text and a data section.
fn file_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

fn error(bytes: &[u8]) -> String {
    let e = parse_safetensors(FILE, bytes).expect_err("malformed file accepted").to_string();
    assert!(e.starts_with(FILE), "message does not name the file: {e}");
    assert!(!e.contains('\n'), "message is not one line: {e}");
    e
}

fn entry(name: &str, dtype: &str, shape: &str, start: usize, end: usize) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{start},{end}]}}"#)
}

#[test]
fn shorter_than_prefix() {
    let e = error(&[1, 2, 3]);
    assert!(e.contains("3 bytes") && e.contains("too short"), "{e}");
}

#[test]
fn header_length_beyond_file() {
    let mut b = 99999u64.to_le_bytes().to_vec();
    b.extend([b' '; 12]);
    let e = error(&b);
    assert!(e.contains("header length 99999 exceeds file size 20"), "{e}");
}

#[test]
fn absurd_header_length() {
    let mut b = u64::MAX.to_le_bytes().to_vec();
    b.extend(b"{}");
    let e = error(&b);
    assert!(e.contains(&format!("header length {}", u64::MAX)), "{e}");
}

#[test]
fn header_over_the_limit() {
    let len = MAX_HEADER + 1;
    let mut b = len.to_le_bytes().to_vec();
    b.resize(b.len() + len as usize, b' ');
    let e = error(&b);
    assert!(e.contains(&format!("header length {len} exceeds the limit of {MAX_HEADER} bytes")), "{e}");
}

#[test]
fn header_not_utf8() {
    let mut b = 2u64.to_le_bytes().to_vec();
    b.extend([0xff, 0xfe]);
    assert!(error(&b).contains("not UTF-8"));
}

#[test]
fn header_not_json() {
    assert!(error(&file_bytes("{\"a\": ", &[])).contains("not valid JSON"));
}

#[test]
fn header_not_an_object() {
    let e = error(&file_bytes("[1, 2]", &[]));
    assert!(e.contains("an array, expected a JSON object"), "{e}");
}

#[test]
fn name_given_twice() {
    let a = entry("q", "F32", "[1]", 0, 4);
    let e = error(&file_bytes(&format!("{{{a}, {a}}}"), &[0; 4]));
    assert!(e.contains("tensor 'q'") && e.contains("name given twice"), "{e}");
}

#[test]
fn entry_not_an_object() {
    let e = error(&file_bytes(r#"{"k": 3}"#, &[]));
    assert!(e.contains("tensor 'k'") && e.contains("a number, expected an object"), "{e}");
}

#[test]
fn unknown_dtype() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F8_E4M3", "[1]", 0, 1)), &[0]));
    assert!(e.contains("tensor 'k'") && e.contains("dtype F8_E4M3, expected one of F16"), "{e}");
}

#[test]
fn dtype_not_a_string() {
    let e = error(&file_bytes(r#"{"k":{"dtype":4,"shape":[],"data_offsets":[0,4]}}"#, &[0; 4]));
    assert!(e.contains("field 'dtype' is a number, expected a string"), "{e}");
}

#[test]
fn negative_dimension() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F32", "[-1]", 0, 4)), &[0; 4]));
    assert!(e.contains("tensor 'k'") && e.contains("field 'shape'"), "{e}");
}

#[test]
fn missing_offsets() {
    let e = error(&file_bytes(r#"{"k":{"dtype":"F32","shape":[1]}}"#, &[0; 4]));
    assert!(e.contains("field 'data_offsets' is missing"), "{e}");
}

#[test]
fn three_offsets() {
    let e = error(&file_bytes(r#"{"k":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#, &[0; 4]));
    assert!(e.contains("field 'data_offsets'") && e.contains("two non-negative integers"), "{e}");
}

#[test]
fn unknown_field() {
    let e = error(&file_bytes(r#"{"k":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#, &[0; 4]));
    assert!(e.contains("unknown field 'x'"), "{e}");
}

#[test]
fn shape_product_overflows() {
    let big = 1u64 << 32;
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "U8", &format!("[{big},{big},2]"), 0, 4)), &[0; 4]));
    assert!(e.contains("tensor 'k'") && e.contains("overflows"), "{e}");
}

#[test]
fn byte_size_overflows() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F64", &format!("[{}]", 1u64 << 62), 0, 4)), &[0; 4]));
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn byte_length_mismatch() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F32", "[2,2]", 0, 12)), &[0; 12]));
    assert!(e.contains("tensor 'k'") && e.contains("shape [2, 2] of F32 needs 16 bytes, found 12"), "{e}");
}

#[test]
fn offsets_reversed() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F32", "[1]", 8, 4)), &[0; 8]));
    assert!(e.contains("[8, 4] end before they start"), "{e}");
}

#[test]
fn offsets_beyond_data() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("k", "F32", "[4]", 0, 16)), &[0; 8]));
    assert!(e.contains("tensor 'k'") && e.contains("beyond the data section of 8 bytes"), "{e}");
}

#[test]
fn offsets_overlap() {
    let header = format!("{{{},{}}}", entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12));
    let e = error(&file_bytes(&header, &[0; 12]));
    assert!(e.contains("tensor 'b'") && e.contains("overlap tensor 'a'"), "{e}");
}

#[test]
fn offsets_leave_gap() {
    let header = format!("{{{},{}}}", entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 8, 12));
    let e = error(&file_bytes(&header, &[0; 12]));
    assert!(e.contains("tensor 'b'") && e.contains("leave bytes 4..8 unused after tensor 'a'"), "{e}");
}

#[test]
fn offsets_do_not_cover_data() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("a", "F32", "[1]", 0, 4)), &[0; 8]));
    assert!(e.contains("cover 4 bytes, the data section holds 8"), "{e}");
}

#[test]
fn boolean_byte_not_0_or_1() {
    let e = error(&file_bytes(&format!("{{{}}}", entry("m", "BOOL", "[3]", 0, 3)), &[1, 0, 2]));
    assert!(e.contains("tensor 'm'") && e.contains("element 2 is stored as byte 2"), "{e}");
}

#[test]
fn metadata_must_hold_strings() {
    let e = error(&file_bytes(r#"{"__metadata__":{"a":1}}"#, &[]));
    assert!(e.contains("__metadata__"), "{e}");
    let ok = parse_safetensors(FILE, &file_bytes(r#"{"__metadata__":{"a":"b"}}"#, &[])).unwrap();
    assert!(ok.is_empty());
}

#[test]
fn decodes_little_endian_values() {
    let header = format!("{{{},{}}}", entry("x", "F32", "[2]", 0, 8), entry("i", "I64", "[1,1]", 8, 16));
    let mut data = 1.5f32.to_le_bytes().to_vec();
    data.extend((-2.0f32).to_le_bytes());
    data.extend((-7i64).to_le_bytes());
    let map = parse_safetensors(FILE, &file_bytes(&header, &data)).unwrap();
    assert_eq!(map["x"], HostTensor { shape: vec![2], data: HostData::F32(vec![1.5, -2.0]) });
    assert_eq!(map["i"], HostTensor { shape: vec![1, 1], data: HostData::I64(vec![-7]) });
}

#[test]
fn reads_file_written_by_safetensors_crate() {
    let bytes: Vec<u8> = [0.25f32, 8.0, -1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let halves: Vec<u8> = [1.0f32, -3.5].iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect();
    let views = [
        ("a", safetensors::tensor::TensorView::new(Dtype::F32, vec![3, 1], &bytes).unwrap()),
        ("b", safetensors::tensor::TensorView::new(Dtype::BF16, vec![2], &halves).unwrap()),
    ];
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let file = safetensors::serialize(views, Some(meta)).unwrap();
    let map = parse_safetensors(FILE, &file).unwrap();
    assert_eq!(map["a"].data, HostData::F32(vec![0.25, 8.0, -1.0]));
    assert_eq!(map["a"].shape, vec![3, 1]);
    assert_eq!(map["b"].data, HostData::Bf16(vec![bf16::from_f32(1.0), bf16::from_f32(-3.5)]));
}

fn sample_tensors() -> Vec<(String, HostTensor)> {
    let t = |shape: Vec<usize>, data| HostTensor::new(shape, data).unwrap();
    vec![
        ("f16".into(), t(vec![2, 1], HostData::F16(vec![f16::from_f32(0.5), f16::NEG_INFINITY]))),
        ("bf16".into(), t(vec![1], HostData::Bf16(vec![bf16::from_f32(-2.0)]))),
        ("f32".into(), t(vec![2, 0, 3], HostData::F32(vec![]))),
        ("f64".into(), t(vec![], HostData::F64(vec![std::f64::consts::PI]))),
        ("bool".into(), t(vec![3], HostData::Bool(vec![true, false, true]))),
        ("u8".into(), t(vec![2], HostData::U8(vec![0, 255]))),
        ("i32".into(), t(vec![1, 2], HostData::I32(vec![i32::MIN, 5]))),
        ("i64".into(), t(vec![1], HostData::I64(vec![i64::MAX]))),
    ]
}

#[test]
fn round_trip_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let tensors = sample_tensors();
    let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_safetensors(&path, &refs).unwrap();
    let back = read_safetensors(&path).unwrap();
    assert_eq!(back.len(), tensors.len());
    for (name, t) in &tensors {
        assert_eq!(&back[name], t, "tensor {name}");
    }
    let dtypes: Vec<DType> = back.values().map(|t| t.data.dtype()).collect();
    assert!(DType::ALL.iter().all(|d| dtypes.contains(d)));
}

#[test]
fn write_refuses_duplicate_names() {
    let dir = tempfile::tempdir().unwrap();
    let t = HostTensor::new(vec![1], HostData::F32(vec![1.0])).unwrap();
    let e = write_safetensors(&dir.path().join("d.safetensors"), &[("a", &t), ("a", &t)]).unwrap_err();
    assert!(e.to_string().contains("tensor 'a'"), "{e}");
}

#[test]
fn file_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.safetensors");
    let e = read_safetensors(&missing).unwrap_err().to_string();
    assert!(e.contains("missing.safetensors") && e.contains("cannot read"), "{e}");
    let e = read_safetensors(dir.path()).unwrap_err();
    assert!(matches!(e.kind, IoErrorKind::NotAFile), "{e}");
    let short = dir.path().join("short.safetensors");
    std::fs::write(&short, [0u8; 5]).unwrap();
    let e = read_safetensors(&short).unwrap_err().to_string();
    assert!(e.contains("short.safetensors") && e.contains("5 bytes"), "{e}");
}

/// A valid file with a few tensors, as mutation seed.
fn valid_file() -> Vec<u8> {
    let header = format!(
        "{{{},{},{}}}",
        entry("q", "F32", "[1,2]", 0, 8),
        entry("m", "BOOL", "[2]", 8, 10),
        entry("n", "I32", "[1]", 10, 14)
    );
    file_bytes(&header, &[0, 0, 128, 63, 0, 0, 0, 64, 1, 0, 7, 0, 0, 0])
}

/// If this reader accepts `bytes`, the `safetensors` crate does too, with the same tensors.
fn agrees_with_crate(bytes: &[u8]) {
    let Ok(mine) = parse_safetensors(FILE, bytes) else { return };
    let theirs = SafeTensors::deserialize(bytes).expect("crate refuses a file this reader accepts");
    assert_eq!(theirs.len(), mine.len());
    for (name, t) in &mine {
        let view = theirs.tensor(name).unwrap();
        assert_eq!(view.shape(), t.shape.as_slice());
        assert_eq!(view.data(), t.data.to_le_bytes().as_slice());
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        agrees_with_crate(&bytes);
    }

    #[test]
    fn random_headers_never_panic(header in "\\{[\"a-z0-9:,\\[\\]{}_ ]{0,80}\\}", data in proptest::collection::vec(any::<u8>(), 0..32)) {
        agrees_with_crate(&file_bytes(&header, &data));
    }

    #[test]
    fn mutated_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut bytes = valid_file();
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        agrees_with_crate(&bytes);
    }
}
