//! The character vocabulary: ids, encoding and decoding, JSON save and load, refusals of malformed
//! or mismatched files, and encode → decode being the identity on texts over the vocabulary.

use std::path::Path;

use attn_train::data::vocab::{BOS, EOS, NUM_SPECIALS, PAD, UNK};
use attn_train::data::{DataError, Vocab};
use proptest::prelude::*;

#[test]
fn ids_are_specials_then_sorted_distinct_characters() {
    let v = Vocab::from_texts(["hello", "world", "", "héllo"]);
    assert_eq!(v.chars(), ['d', 'e', 'h', 'l', 'o', 'r', 'w', 'é']);
    assert_eq!(v.len(), 12);
    assert_eq!((v.id('d'), v.id('é'), v.id('z')), (NUM_SPECIALS, NUM_SPECIALS + 7, UNK));
    assert_eq!((v.char(4), v.char(11), v.char(12), v.char(PAD), v.char(UNK)), (Some('d'), Some('é'), None, None, None));
    assert_eq!(Vocab::from_texts(["world", "hello", "héllo"]), v, "not independent of the corpus order");
    assert!(Vocab::from_texts([""; 0]).is_empty());
}

#[test]
fn encode_adds_the_asked_specials_and_decode_stops_at_eos() {
    let v = Vocab::from_texts(["abc"]);
    let (a, b, c) = (v.id('a'), v.id('b'), v.id('c'));
    assert_eq!(v.encode("cab", false, false), [c, a, b]);
    assert_eq!(v.encode("cab", true, false), [BOS, c, a, b]);
    assert_eq!(v.encode("cab", false, true), [c, a, b, EOS]);
    assert_eq!(v.encode("axb", true, true), [BOS, a, UNK, b, EOS]);
    assert_eq!(v.encode("", true, true), [BOS, EOS]);
    assert_eq!(v.decode(&[BOS, c, PAD, a, EOS, b, b]), "ca");
    assert_eq!(v.decode(&[a, UNK, 999, b]), "ab");
}

#[test]
fn save_and_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vocab.json");
    let v = Vocab::from_texts(["tab\there, \"quotes\", newline\n, ünïcödé ✓"]);
    v.save(&path).unwrap();
    assert_eq!(Vocab::load(&path).unwrap(), v);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["format"], "attn-char-vocab");
    assert_eq!(json["specials"], serde_json::json!(["<pad>", "<bos>", "<eos>", "<unk>"]));
    assert_eq!(json["chars"][0], "\t");
}

fn load_text(text: &str) -> DataError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.json");
    std::fs::write(&path, text).unwrap();
    let err = Vocab::load(&path).unwrap_err();
    assert!(err.to_string().starts_with(&path.display().to_string()), "error does not name the file: {err}");
    err
}

const SPECIALS: [&str; 4] = ["<pad>", "<bos>", "<eos>", "<unk>"];

fn vocab_json(format: &str, version: u32, specials: &[&str], chars: &[&str]) -> String {
    serde_json::json!({"format": format, "version": version, "specials": specials, "chars": chars}).to_string()
}

#[test]
fn malformed_files_are_refused_with_the_reason() {
    let err = load_text("{\"format\": ");
    assert!(matches!(err, DataError::VocabJson { .. }), "{err:?}");
    assert!(err.to_string().contains("line 1"), "{err}");
    let missing_chars = r#"{"format": "attn-char-vocab", "version": 1, "specials": []}"#;
    assert!(matches!(load_text(missing_chars), DataError::VocabJson { .. }));
    let extra = vocab_json("attn-char-vocab", 1, &SPECIALS, &[]).replace('}', ", \"extra\": 1}");
    assert!(matches!(load_text(&extra), DataError::VocabJson { .. }));
    assert!(matches!(load_text("[1, 2]"), DataError::VocabJson { .. }));

    let cases = [
        (vocab_json("other", 1, &SPECIALS, &["a"]), "format", "found \"other\""),
        (vocab_json("attn-char-vocab", 2, &SPECIALS, &["a"]), "version", "found 2"),
        (vocab_json("attn-char-vocab", 1, &["<pad>", "<bos>", "<eos>", "<mask>"], &["a"]), "specials", "<mask>"),
        (
            vocab_json("attn-char-vocab", 1, &SPECIALS[..3], &["a"]),
            "specials",
            "found [\"<pad>\", \"<bos>\", \"<eos>\"]",
        ),
        (vocab_json("attn-char-vocab", 1, &SPECIALS, &["a", "bc"]), "chars", "found \"bc\" at index 1"),
        (vocab_json("attn-char-vocab", 1, &SPECIALS, &[""]), "chars", "found \"\" at index 0"),
        (vocab_json("attn-char-vocab", 1, &SPECIALS, &["b", "a"]), "chars", "found 'b' then 'a' at index 1"),
        (vocab_json("attn-char-vocab", 1, &SPECIALS, &["a", "a"]), "chars", "found 'a' then 'a' at index 1"),
    ];
    for (body, field, found) in cases {
        let err = load_text(&body);
        let DataError::VocabInvalid { field: f, .. } = &err else {
            panic!("{body}: expected VocabInvalid, got {err:?}")
        };
        assert_eq!(*f, field, "{body}");
        assert!(err.to_string().contains(found), "{body}: {err}");
    }
    let good = vocab_json("attn-char-vocab", 1, &SPECIALS, &[" ", "a", "é"]);
    assert_eq!(Vocab::from_json(&good, Path::new("mem")).unwrap(), Vocab::from_texts(["a é"]));
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let err = Vocab::load(Path::new("/nonexistent/vocab.json")).unwrap_err();
    assert!(matches!(err, DataError::Io { .. }));
    assert!(err.to_string().starts_with("/nonexistent/vocab.json: "), "{err}");
}

proptest! {
    #[test]
    fn encode_then_decode_is_the_identity(corpus in "\\PC{1,40}", picks in prop::collection::vec(any::<prop::sample::Index>(), 0..60)) {
        let v = Vocab::from_texts([&corpus]);
        let text: String = picks.iter().map(|i| v.chars()[i.index(v.chars().len())]).collect();
        for (bos, eos) in [(false, false), (true, false), (false, true), (true, true)] {
            let ids = v.encode(&text, bos, eos);
            prop_assert_eq!(ids.len(), text.chars().count() + usize::from(bos) + usize::from(eos));
            prop_assert!(!ids.contains(&UNK));
            prop_assert_eq!(v.decode(&ids), text.clone());
        }
        let reloaded = Vocab::from_json(&v.to_json(), Path::new("mem")).unwrap();
        prop_assert_eq!(reloaded, v);
    }
}
