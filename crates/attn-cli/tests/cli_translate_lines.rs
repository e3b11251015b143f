//! `attn translate` answers line by line and never invents an answer: an empty line is skipped
//! with a note, a line that cannot be answered (not UTF-8, too long, characters outside the
//! vocabulary, for the dates task an output that is no calendar date) is named on stderr by its
//! number with its text cut short, the other lines still get their answers (one output line per
//! input line, empty where there is none), and the exit status is 1 if any line failed.

use crate::train_common;

use std::path::Path;

use train_common::{attn, attn_with, text, train, write_pairs};

fn checkpoint(dir: &Path, extra: &[&str]) {
    let o = train(dir, &[&["--steps", "10"], extra].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn bad_lines_are_reported_and_the_others_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, dir) = (tmp.path().join("pairs.tsv"), tmp.path().join("m"));
    write_pairs(&data, 60);
    checkpoint(&dir, &["--data", data.to_str().unwrap(), "--max-len", "10"]);
    let d = dir.to_str().unwrap();
    let alone = attn(&["translate", "--checkpoint", d, "abc", "cab"]);
    assert!(alone.status.success(), "{}", text(&alone.stderr));
    let answers: Vec<String> = text(&alone.stdout).lines().map(String::from).collect();
    assert_eq!(answers.len(), 2);

    let long = "a".repeat(100_000);
    let input = [b"abc\n\nab\xF0\x9F\x98\x80c\n".as_slice(), long.as_bytes(), b"\nab\xffc\ncab\n"].concat();
    let o = attn_with(&["translate", "--checkpoint", d], &[], &input);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{err}");
    let expected = [answers[0].as_str(), "", "", "", "", answers[1].as_str()];
    assert_eq!(out.lines().collect::<Vec<_>>(), expected, "{err}");
    let about = |n: usize| err.lines().filter(move |l| l.starts_with(&format!("line {n}:"))).collect::<Vec<_>>();
    assert!(about(1).is_empty() && about(6).is_empty(), "{err}");
    assert!(about(2).len() == 1 && about(2)[0].contains("empty"), "{err}");
    assert!(about(3).len() == 1 && about(3)[0].contains("U+1F600"), "{err}");
    assert!(about(4).len() == 1 && about(4)[0].contains("100000 characters"), "{err}");
    assert!(about(4)[0].len() < 300, "the long line is not cut: {} bytes", about(4)[0].len());
    assert!(about(5).len() == 1 && about(5)[0].contains("UTF-8"), "{err}");
    let last = err.lines().last().unwrap();
    assert!(last.starts_with("error: ") && last.contains("3 of 6 lines"), "{err}");
}

#[test]
fn an_empty_line_alone_is_skipped_not_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    checkpoint(&dir, &[]);
    let png = tmp.path().join("a.png");
    let o = attn_with(
        &["translate", "--checkpoint", dir.to_str().unwrap(), "--heatmap", png.to_str().unwrap()],
        &[],
        b"\n",
    );
    assert_eq!(text(&o.stdout), "\n", "an answer was invented for an empty line");
    let err = text(&o.stderr);
    assert!(err.contains("line 1: empty") && err.contains("no line was answered, nothing drawn"), "{err}");
    assert!(!tmp.path().join("a-average.png").exists());
}

#[test]
fn dates_outside_the_vocabulary_or_the_calendar_are_not_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    checkpoint(&dir, &[]);
    // Ten steps teach no dates: whatever the model writes is not one, and must not be passed on.
    let o = attn(&["translate", "--checkpoint", dir.to_str().unwrap(), "３.3.2021", "3 March 2021"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(out, "\n\n", "{err}");
    assert!(err.lines().any(|l| l.starts_with("text 1:") && l.contains("U+FF13")), "{err}");
    assert!(err.lines().any(|l| l.starts_with("text 2:") && l.contains("not a calendar date")), "{err}");
}
