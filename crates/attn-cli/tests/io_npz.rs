//! The `.npz` reader and writer: archives NumPy wrote (`tests/fixtures/numpy_savez*.npz`, made by
//! `scripts/gen_npz_fixtures.py`) read to the values their formulas give; write→read round trips;
//! one test per malformed-archive case, built byte by byte here (each asserting the message names
//! the problem and the member); and property tests that random or mutated bytes never panic.

use attn_cli::alloc_meter;
use attn_cli::io::{npz_bytes, parse_npz, read_npz, HostData, HostTensor, IoError, MAX_DEFLATE_RATIO};
use half::f16;
use proptest::prelude::*;

const FILE: &str = "x.npz";
const STORED: u16 = 0;
const DEFLATED: u16 = 8;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A `.npy` file (version 1.0) of float32 `values` with shape `[n]`.
fn npy_f32(values: &[f32]) -> Vec<u8> {
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", values.len());
    let padded = (10 + dict.len() + 1).next_multiple_of(64) - 10;
    let header = format!("{dict}{}\n", " ".repeat(padded - dict.len() - 1));
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    b.extend(values.iter().flat_map(|x| x.to_le_bytes()));
    b
}

/// CRC-32 (IEEE), as zip stores it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// `data` as a deflate stream of uncompressed blocks (valid deflate, no compression).
fn deflate_stored(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = if data.is_empty() { vec![&[]] } else { data.chunks(65535).collect() };
    for (i, chunk) in chunks.iter().enumerate() {
        out.push(u8::from(i + 1 == chunks.len()));
        let len = chunk.len() as u16;
        out.extend(len.to_le_bytes());
        out.extend((!len).to_le_bytes());
        out.extend(*chunk);
    }
    out
}

/// One member as written into the archive; every field can be made to lie.
#[derive(Clone)]
struct Member {
    name: String,
    method: u16,
    flags: u16,
    /// The bytes stored in the archive (compressed for deflate).
    raw: Vec<u8>,
    crc: u32,
    /// Declared uncompressed size.
    size: u64,
    /// Index of an earlier member whose local header this central entry points at.
    same_data_as: Option<usize>,
}

impl Member {
    fn stored(name: &str, data: &[u8]) -> Self {
        let (crc, size) = (crc32(data), data.len() as u64);
        Self { name: name.into(), method: STORED, flags: 0, raw: data.to_vec(), crc, size, same_data_as: None }
    }

    fn deflated(name: &str, data: &[u8]) -> Self {
        Self { method: DEFLATED, raw: deflate_stored(data), ..Self::stored(name, data) }
    }
}

/// A zip archive of `members` (zip64 extra fields where a size does not fit in 32 bits).
fn archive(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let mut offsets = Vec::new();
    for m in members {
        let csize = m.raw.len() as u64;
        let big = m.size >= 0xFFFF_FFFF || csize >= 0xFFFF_FFFF;
        let (size32, csize32) = if big { (u32::MAX, u32::MAX) } else { (m.size as u32, csize as u32) };
        let extra: Vec<u8> = if big {
            [&1u16.to_le_bytes()[..], &16u16.to_le_bytes(), &m.size.to_le_bytes(), &csize.to_le_bytes()].concat()
        } else {
            Vec::new()
        };
        let offset = match m.same_data_as {
            Some(i) => offsets[i],
            None => {
                let at = out.len() as u32;
                out.extend(b"PK\x03\x04");
                out.extend(if big { 45u16 } else { 20u16 }.to_le_bytes());
                out.extend(m.flags.to_le_bytes());
                out.extend(m.method.to_le_bytes());
                out.extend([0, 0, 0x21, 0]); // 1980-01-01 00:00
                out.extend(m.crc.to_le_bytes());
                out.extend(csize32.to_le_bytes());
                out.extend(size32.to_le_bytes());
                out.extend((m.name.len() as u16).to_le_bytes());
                out.extend((extra.len() as u16).to_le_bytes());
                out.extend(m.name.as_bytes());
                out.extend(&extra);
                out.extend(&m.raw);
                at
            }
        };
        offsets.push(offset);
        central.extend(b"PK\x01\x02");
        central.extend(20u16.to_le_bytes());
        central.extend(if big { 45u16 } else { 20u16 }.to_le_bytes());
        central.extend(m.flags.to_le_bytes());
        central.extend(m.method.to_le_bytes());
        central.extend([0, 0, 0x21, 0]);
        central.extend(m.crc.to_le_bytes());
        central.extend(csize32.to_le_bytes());
        central.extend(size32.to_le_bytes());
        central.extend((m.name.len() as u16).to_le_bytes());
        central.extend((extra.len() as u16).to_le_bytes());
        central.extend([0u8; 6]); // comment length, disk, internal attributes
        central.extend(0o100644u32.wrapping_shl(16).to_le_bytes());
        central.extend(offset.to_le_bytes());
        central.extend(m.name.as_bytes());
        central.extend(&extra);
    }
    let dir_start = out.len() as u32;
    out.extend(&central);
    out.extend(b"PK\x05\x06");
    out.extend([0u8; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(dir_start.to_le_bytes());
    out.extend([0u8; 2]);
    out
}

fn error(bytes: &[u8]) -> String {
    let e = parse_npz(FILE, bytes).expect_err("malformed archive accepted").to_string();
    assert!(e.starts_with("x.npz"), "message does not name the file: {e}");
    assert!(!e.contains('\n'), "message is not one line: {e}");
    e
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    t.to_f32_vec().unwrap()
}

#[test]
fn numpy_savez_and_savez_compressed_are_read() {
    for name in ["numpy_savez.npz", "numpy_savez_compressed.npz"] {
        let t = read_npz(&fixture(name)).unwrap();
        let names: Vec<&str> = t.keys().map(String::as_str).collect();
        assert_eq!(names, ["k", "key_lengths", "mask", "q", "v"], "{name}");
        let q: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
        assert_eq!((t["q"].shape.as_slice(), t["q"].dtype_name(), f32s(&t["q"])), (&[1, 2, 3, 4][..], "F32", q));
        let k: Vec<f16> = (0..12).map(|i| f16::from_f32(i as f32 * 0.5 - 2.0)).collect();
        assert_eq!(t["k"], HostTensor::new(vec![1, 1, 3, 4], HostData::F16(k)).unwrap(), "{name}");
        let v: Vec<f64> = (0..6).map(|i| f64::from(i) - 2.5).collect();
        assert_eq!(t["v"], HostTensor::new(vec![1, 1, 3, 2], HostData::F64(v)).unwrap(), "{name}");
        let tril = (0..9).map(|i| i % 3 <= i / 3).collect();
        assert_eq!(t["mask"], HostTensor::new(vec![3, 3], HostData::Bool(tril)).unwrap(), "{name}");
        assert_eq!(t["key_lengths"], HostTensor::new(vec![1], HostData::I64(vec![2])).unwrap(), "{name}");
    }
}

#[test]
fn written_archives_read_back_in_every_npy_type() {
    let tensors = [
        ("a", HostTensor::new(vec![2, 3], HostData::F32(vec![1.5, -2.0, 0.0, 3.25, f32::NAN, -0.0])).unwrap()),
        ("b", HostTensor::new(vec![2], HostData::F16(vec![f16::ONE, f16::NEG_INFINITY])).unwrap()),
        ("c", HostTensor::new(vec![], HostData::F64(vec![7.0])).unwrap()),
        ("mask", HostTensor::new(vec![1, 3], HostData::Bool(vec![true, false, true])).unwrap()),
        ("d", HostTensor::new(vec![0, 4], HostData::U8(vec![])).unwrap()),
        ("e", HostTensor::new(vec![2], HostData::I32(vec![-1, 5])).unwrap()),
        ("f", HostTensor::new(vec![1], HostData::I64(vec![i64::MIN])).unwrap()),
    ];
    let refs: Vec<(&str, &HostTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let back = parse_npz(FILE, &npz_bytes(FILE, &refs).unwrap()).unwrap();
    assert_eq!(back.len(), tensors.len());
    for (name, t) in &tensors {
        assert_eq!(format!("{:?}", back[*name]), format!("{t:?}"), "{name}"); // NaN compares by text
    }
}

#[test]
fn writing_refuses_bf16_and_duplicate_names() {
    let bf = HostTensor::new(vec![1], HostData::Bf16(vec![half::bf16::ONE])).unwrap();
    let e = npz_bytes("o.npz", &[("w", &bf)]).unwrap_err().to_string();
    assert!(e.contains("o.npz") && e.contains("tensor 'w'") && e.contains("dtype BF16"), "{e}");
    let t = HostTensor::new(vec![1], HostData::F32(vec![1.0])).unwrap();
    let e = npz_bytes("o.npz", &[("w", &t), ("w", &t)]).unwrap_err().to_string();
    assert!(e.contains("tensor 'w'"), "{e}");
}

#[test]
fn hand_built_archives_read_like_numpy_ones() {
    let q = npy_f32(&[1.0, 2.0, 3.0]);
    for member in [Member::stored("q.npy", &q), Member::deflated("q.npy", &q)] {
        let t = parse_npz(FILE, &archive(&[member])).unwrap();
        assert_eq!(f32s(&t["q"]), [1.0, 2.0, 3.0]);
    }
    assert!(parse_npz(FILE, &archive(&[])).unwrap().is_empty(), "an empty archive holds no tensors");
}

#[test]
fn not_a_zip_archive() {
    let e = error(b"PK\x03\x04 this is not really a zip archive");
    assert!(e.contains("not a valid zip archive"), "{e}");
    assert!(error(b"").contains("not a valid zip archive"));
}

#[test]
fn member_claiming_a_terabyte_is_refused_before_allocating() {
    let q = npy_f32(&[1.0; 8]);
    for method in [STORED, DEFLATED] {
        let mut m = if method == STORED { Member::stored("q.npy", &q) } else { Member::deflated("q.npy", &q) };
        m.size = 1 << 40;
        let bytes = archive(&[m.clone()]);
        let base = alloc_meter::reset_peak();
        let e = error(&bytes);
        let held = alloc_meter::peak_bytes().saturating_sub(base);
        assert!(e.contains("member 'q.npy'") && e.contains("declares 1099511627776 bytes"), "{e}");
        assert!(e.contains(&format!("{} compressed bytes", m.raw.len())), "{e}");
        assert!(held < 64 << 20, "refusing held {held} bytes");
    }
    assert_eq!(MAX_DEFLATE_RATIO, 1032);
}

#[test]
fn deflated_member_declaring_more_than_deflate_can_expand_is_refused() {
    let q = npy_f32(&[0.5; 4]);
    let mut m = Member::deflated("q.npy", &q);
    m.size = m.raw.len() as u64 * MAX_DEFLATE_RATIO + 1;
    let e = error(&archive(&[m]));
    assert!(e.contains("member 'q.npy' declares"), "{e}");
}

#[test]
fn stored_member_whose_sizes_disagree() {
    let q = npy_f32(&[1.0, 2.0]);
    let mut m = Member::stored("q.npy", &q);
    m.size += 1;
    let e = error(&archive(&[m]));
    assert!(e.contains("member 'q.npy' declares") && e.contains(&format!("{} compressed bytes", q.len())), "{e}");
}

#[test]
fn member_decompressing_to_other_than_its_declared_size() {
    let q = npy_f32(&[1.0, 2.0, 3.0]);
    let mut short = Member::deflated("q.npy", &q);
    short.size += 4;
    let e = error(&archive(&[short]));
    assert!(e.contains("member 'q.npy'") && e.contains(&format!("declared {}", q.len() + 4)), "{e}");
    let mut long = Member::deflated("q.npy", &q);
    long.size -= 4;
    let e = error(&archive(&[long]));
    assert!(e.contains("member 'q.npy'") && (e.contains("more bytes") || e.contains("decompress")), "{e}");
}

#[test]
fn duplicate_member_names() {
    let q = npy_f32(&[1.0]);
    let e = error(&archive(&[Member::stored("q.npy", &q), Member::stored("q.npy", &q)]));
    assert!(e.contains("listed twice"), "{e}");
}

#[test]
fn members_that_are_not_npy_arrays() {
    let q = npy_f32(&[1.0]);
    for name in ["readme.txt", "q", ".npy", "dir/"] {
        let e = error(&archive(&[Member::stored("q.npy", &q), Member::stored(name, b"")]));
        assert!(e.contains(&format!("member '{name}' is not an array")) && e.contains("NAME.npy"), "{e}");
    }
}

#[test]
fn unsupported_compression_and_encryption() {
    let q = npy_f32(&[1.0]);
    let bzip2 = Member { method: 12, ..Member::stored("q.npy", &q) };
    let e = error(&archive(&[bzip2]));
    assert!(e.contains("member 'q.npy' is compressed with") && e.contains("expected stored or deflated"), "{e}");
    let encrypted = Member { flags: 1, ..Member::stored("q.npy", &q) };
    let e = error(&archive(&[encrypted]));
    assert!(e.contains("member 'q.npy' is encrypted"), "{e}");
}

#[test]
fn members_sharing_their_bytes_cannot_multiply_the_archive() {
    let q = npy_f32(&[1.0; 64]);
    let k = Member { name: "k.npy".into(), same_data_as: Some(0), ..Member::stored("q.npy", &q) };
    let e = error(&archive(&[Member::stored("q.npy", &q), k]));
    assert!(e.contains("compressed bytes or more, the archive has"), "{e}");
}

#[test]
fn corrupt_member_data_fails_its_checksum() {
    let q = npy_f32(&[1.0, 2.0]);
    let mut m = Member::stored("q.npy", &q);
    m.crc ^= 1;
    let e = error(&archive(&[m]));
    assert!(e.contains("member 'q.npy' cannot be decompressed"), "{e}");
}

#[test]
fn malformed_npy_member_is_reported_with_the_member() {
    let mut q = npy_f32(&[1.0, 2.0]);
    q.pop();
    let e = error(&archive(&[Member::deflated("q.npy", &q)]));
    assert!(e.starts_with("x.npz member q.npy: ") && e.contains("needs 8 bytes, found 7"), "{e}");
}

#[test]
fn io_errors_name_the_file() {
    let e: IoError = read_npz(std::path::Path::new("/no/such/dir/x.npz")).unwrap_err();
    assert!(e.to_string().starts_with("/no/such/dir/x.npz: cannot read"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_npz(FILE, &bytes);
        let mut zip = b"PK\x03\x04".to_vec();
        zip.extend(&bytes);
        let _ = parse_npz(FILE, &zip);
    }

    #[test]
    fn mutated_archives_never_panic(at in 0usize..4096, value in any::<u8>(), cut in 0usize..4096) {
        let q = npy_f32(&[1.0, -2.0, 3.5]);
        let good = archive(&[Member::deflated("q.npy", &q), Member::stored("k.npy", &q)]);
        let mut bad = good.clone();
        let at = at % bad.len();
        bad[at] = value;
        let _ = parse_npz(FILE, &bad);
        let _ = parse_npz(FILE, &good[..cut % good.len()]);
    }
}
