//! `attn train` and `attn translate` end to end on a tiny model: a run writes its checkpoint and
//! curves, `translate` answers one line per text (arguments or standard input) and draws the
//! alignment; bad data, flags and checkpoints are refused with the file, line or flag named,
//! exit code 1 and no checkpoint written.

use crate::train_common;

use std::io::Write;
use std::process::{Command, Stdio};

use train_common::{attn, text, train, write_pairs};

/// On a pairs file, whose outputs are not checked as dates: a 20-step model answers anything.
#[test]
fn train_then_translate_with_a_heatmap() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, dir) = (tmp.path().join("pairs.tsv"), tmp.path().join("model"));
    write_pairs(&data, 60);
    let o = train(&dir, &["--steps", "20", "--data", data.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("step     10: held-out exact match") && out.contains("trained 20 steps"), "{out}");
    for f in ["config.json", "vocab.json", "model.safetensors", "optimizer.safetensors", "loss.png", "accuracy.png"] {
        assert!(dir.join(f).is_file(), "{f}");
    }
    let png = tmp.path().join("a.png");
    let o =
        attn(&["translate", "--checkpoint", dir.to_str().unwrap(), "--heatmap", png.to_str().unwrap(), "abc", "cab"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 2);
    for f in ["a-layer1.png", "a-average.png"] {
        assert!(std::fs::read(tmp.path().join(f)).unwrap().starts_with(b"\x89PNG"), "{f}");
    }
    // Standard input, one text a line, gives the same answers.
    let mut child = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["translate", "--checkpoint", dir.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc\ncab\n").unwrap();
    let piped = child.wait_with_output().unwrap();
    assert_eq!(text(&piped.stdout), text(&o.stdout));
    // Resuming extends the run; other settings may not change.
    let o = attn(&["train", "--out", dir.to_str().unwrap(), "--resume", "--steps", "30"]);
    assert!(o.status.success() && text(&o.stdout).contains("trained 30 steps"), "{}", text(&o.stderr));
    let o = attn(&["train", "--out", dir.to_str().unwrap(), "--resume", "--lr", "0.1"]);
    assert!(o.status.code() == Some(1) && text(&o.stderr).contains("--lr"), "{}", text(&o.stderr));
    let o = train(&dir, &["--steps", "20"]);
    assert!(
        o.status.code() == Some(1) && text(&o.stderr).contains("already holds a checkpoint"),
        "{}",
        text(&o.stderr)
    );
}

/// `--attention linear-favor` trains, is saved in `config.json`, and the checkpoint translates
/// (through the layers' recurrent state) with its heatmap of the softmax cross-attention; a
/// resumed run keeps the kind and refuses another; `--packed` is refused with it.
#[test]
fn linear_attention_trains_and_translates() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, dir) = (tmp.path().join("pairs.tsv"), tmp.path().join("model"));
    write_pairs(&data, 60);
    let o = train(&dir, &["--steps", "20", "--data", data.to_str().unwrap(), "--attention", "linear-favor"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(config.contains("\"attention\": \"linear-favor\""), "{config}");
    let png = tmp.path().join("a.png");
    let o = attn(&["translate", "--checkpoint", dir.to_str().unwrap(), "--heatmap", png.to_str().unwrap(), "abc"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).lines().count(), 1);
    assert!(std::fs::read(tmp.path().join("a-average.png")).unwrap().starts_with(b"\x89PNG"));
    let o = attn(&["train", "--out", dir.to_str().unwrap(), "--resume", "--attention", "softmax"]);
    assert!(o.status.code() == Some(1) && text(&o.stderr).contains("--attention"), "{}", text(&o.stderr));
    let o = train(&tmp.path().join("packed"), &["--steps", "2", "--attention", "linear-elu", "--packed"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("--packed: packed batches need softmax attention"), "{}", text(&o.stderr));
}

#[test]
fn bad_pairs_files_name_the_line() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 3] = [
        ("no-tab.tsv", b"abc\tdef\nno tab here\n", "line 2"),
        ("empty.tsv", b"", "no SOURCE<TAB>TARGET pairs"),
        ("long.tsv", b"short\tok\nthis source is far too long for the model's limit\tx\n", "line 2"),
    ];
    for (name, content, expected) in cases {
        let data = tmp.path().join(name);
        std::fs::write(&data, content).unwrap();
        let dir = tmp.path().join(format!("model-{name}"));
        let o = train(&dir, &["--steps", "5", "--max-len", "20", "--data", data.to_str().unwrap()]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(name) && err.contains(expected), "{name}: {err}");
        assert!(!dir.join("config.json").exists(), "{name}: a checkpoint was written");
    }
}

#[test]
fn bad_checkpoints_and_settings_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let o = attn(&["translate", "--checkpoint", missing.to_str().unwrap(), "x"]);
    assert!(o.status.code() == Some(1) && text(&o.stderr).contains("no such folder"), "{}", text(&o.stderr));
    let o = train(&tmp.path().join("m"), &["--steps", "5", "--heads", "3"]);
    assert!(o.status.code() == Some(1) && text(&o.stderr).contains("--heads"), "{}", text(&o.stderr));
    let o = train(&tmp.path().join("m"), &["--steps", "0"]);
    assert!(o.status.code() == Some(1) && text(&o.stderr).contains("--steps"), "{}", text(&o.stderr));
}
