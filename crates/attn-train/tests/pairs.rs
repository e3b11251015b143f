//! Reading a user's parallel text: the pairs of a good file, each refusal with its file and
//! 1-based line, the size limit, and the held-out split.

use std::collections::HashSet;
use std::path::PathBuf;

use attn_train::data::pairs::MAX_FILE_BYTES;
use attn_train::data::{read_pairs, split_held_out, DataError, Pair, Side};

/// Writes `bytes` to a fresh file; the directory lives as long as the returned guard.
fn file(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pairs.tsv");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn pair(s: &str, t: &str) -> Pair {
    (s.to_string(), t.to_string())
}

/// The error of reading `bytes` with `max_len`, checking that its message names the file.
fn refusal(bytes: &[u8], max_len: usize) -> DataError {
    let (_dir, path) = file(bytes);
    let err = read_pairs(&path, max_len).unwrap_err();
    assert!(err.to_string().starts_with(&format!("{}: ", path.display())), "error does not name the file: {err}");
    err
}

#[test]
fn reads_pairs_in_order() {
    let (_dir, path) = file("\u{feff}3 March 2021\t2021-03-03\r\n\nHallo Welt\thello world\nx y \t z\n\n".as_bytes());
    let pairs = read_pairs(&path, 64).unwrap();
    assert_eq!(pairs, [pair("3 March 2021", "2021-03-03"), pair("Hallo Welt", "hello world"), pair("x y ", " z")]);
    let (_dir, path) = file(b"a\tb");
    assert_eq!(read_pairs(&path, 64).unwrap(), [pair("a", "b")], "a last line without a newline");
}

#[test]
fn tabs_are_checked_with_the_line_number() {
    let err = refusal(b"a\tb\n\nno tab here\nc\td\n", 64);
    assert!(matches!(err, DataError::Tabs { line: 3, tabs: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("line 3: expected SOURCE<TAB>TARGET (exactly one tab), found 0 tabs"), "{err}");
    let err = refusal(b"a\tb\tc\n", 64);
    assert!(matches!(err, DataError::Tabs { line: 1, tabs: 2, .. }), "{err:?}");
}

#[test]
fn empty_sides_are_refused() {
    let err = refusal(b"a\tb\n\tb\n", 64);
    assert!(matches!(err, DataError::EmptySide { line: 2, side: Side::Source, .. }), "{err:?}");
    assert!(err.to_string().contains("line 2: the source is empty"), "{err}");
    let err = refusal(b"a\tb\nc\td\ne\t\r\n", 64);
    assert!(matches!(err, DataError::EmptySide { line: 3, side: Side::Target, .. }), "{err:?}");
}

#[test]
fn empty_files_are_refused() {
    for bytes in [&b""[..], b"\n\n\r\n", "\u{feff}".as_bytes()] {
        let err = refusal(bytes, 64);
        assert!(matches!(err, DataError::Empty { .. }), "{bytes:?}: {err:?}");
        assert!(err.to_string().contains("no SOURCE<TAB>TARGET pairs"), "{err}");
    }
}

#[test]
fn lengths_count_characters_plus_one_special() {
    // "ééé" is 3 characters (6 bytes): 4 positions with its special token.
    let (_dir, path) = file("ééé\tabc\n".as_bytes());
    assert_eq!(read_pairs(&path, 4).unwrap(), [pair("ééé", "abc")]);
    let err = refusal("ok\tok\nééé\tab\n".as_bytes(), 3);
    let DataError::TooLong { line, side, chars, positions, max_len, .. } = err else { panic!("{err:?}") };
    assert_eq!((line, side, chars, positions, max_len), (2, Side::Source, 3, 4, 3));
    let err = refusal(b"ab\tabcd\n", 4);
    assert!(matches!(err, DataError::TooLong { line: 1, side: Side::Target, chars: 4, positions: 5, .. }), "{err:?}");
    assert!(err
        .to_string()
        .contains("line 1: the target is 4 characters, 5 positions with bos/eos, more than the model's 4"));
}

#[test]
fn invalid_utf8_is_refused_with_line_and_byte() {
    let err = refusal(b"a\tb\nab\xffc\td\n", 64);
    assert!(matches!(err, DataError::InvalidUtf8 { line: 2, byte: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("line 2: not valid UTF-8 (at byte 3"), "{err}");
}

#[test]
fn missing_and_oversized_files_are_refused() {
    let err = read_pairs(&PathBuf::from("/nonexistent/pairs.tsv"), 64).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }) && err.to_string().starts_with("/nonexistent/pairs.tsv: "), "{err}");
    // A sparse file just over the limit: refused from its size, without reading it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tsv");
    std::fs::File::create(&path).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
    let err = read_pairs(&path, 64).unwrap_err();
    assert!(
        matches!(err, DataError::TooLarge { size, limit, .. } if size == MAX_FILE_BYTES + 1 && limit == MAX_FILE_BYTES)
    );
    assert!(err.to_string().contains("larger than the 268435456-byte limit"), "{err}");
    assert!(matches!(read_pairs(dir.path(), 64).unwrap_err(), DataError::Io { .. }), "a directory");
}

#[test]
fn held_out_split_is_seeded_and_disjoint_by_source() {
    let mut pairs: Vec<Pair> = (0..200).map(|i| pair(&format!("s{i}"), &format!("t{i}"))).collect();
    pairs.extend((0..50).map(|i| pair(&format!("s{i}"), &format!("other{i}")))); // repeated sources
    let (train, held) = split_held_out(pairs.clone(), 40, 1).unwrap();
    assert_eq!(held.len(), 40);
    let held_sources: HashSet<&str> = held.iter().map(|(s, _)| s.as_str()).collect();
    assert!(train.iter().all(|(s, _)| !held_sources.contains(s.as_str())));
    let all: HashSet<&Pair> = pairs.iter().collect();
    assert!(train.iter().chain(&held).all(|p| all.contains(p)));
    assert!(train.len() + held.len() <= pairs.len() && train.len() >= 250 - 80);
    let order = |v: &[Pair]| v.iter().map(|p| pairs.iter().position(|q| q == p).unwrap()).collect::<Vec<_>>();
    assert!(order(&train).is_sorted() && order(&held).is_sorted(), "file order not kept");
    assert_eq!(split_held_out(pairs.clone(), 40, 1).unwrap(), (train, held.clone()));
    assert_ne!(split_held_out(pairs.clone(), 40, 2).unwrap().1, held);

    let err = split_held_out(pairs.clone(), 250, 1).unwrap_err();
    assert!(matches!(err, DataError::Argument { .. }) && err.to_string().contains("fewer than the 250 pairs"), "{err}");
    let same_source = vec![pair("a", "1"), pair("a", "2"), pair("a", "3")];
    assert!(matches!(split_held_out(same_source, 1, 0), Err(DataError::Argument { .. })));
}
