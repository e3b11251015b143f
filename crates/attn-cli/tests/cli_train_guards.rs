//! What `attn train` refuses and says so a run is never silently wrong: `--resume` on changed
//! data, on an edited `config.json` or `vocab.json`; `--out` on a folder holding files the trainer
//! did not write; Ctrl-C saves once and exits 130 saying which step was saved and how old its
//! accuracy is; the held-out default is a fraction of the data, said at the start.

use crate::train_common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use train_common::{attn, one_line_error, text, train, write_pairs, TINY};

fn edit(path: &Path, from: &str, to: &str) {
    let before = std::fs::read_to_string(path).unwrap();
    assert!(before.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, before.replacen(from, to, 1)).unwrap();
}

#[test]
fn resume_refuses_data_whose_contents_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, dir) = (tmp.path().join("pairs.tsv"), tmp.path().join("m"));
    write_pairs(&data, 60);
    let o = train(&dir, &["--steps", "10", "--data", data.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // Same lines, same characters, same count: only which target goes with which source changes.
    let swapped: String = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .map(|l| {
            let (s, t) = l.split_once('\t').unwrap();
            format!("{t}\t{s}\n")
        })
        .collect();
    std::fs::write(&data, swapped).unwrap();
    let o = attn(&["train", "--out", dir.to_str().unwrap(), "--resume", "--steps", "20"]);
    one_line_error(&o, &["pairs.tsv", "changed"]);
    // `explain heads` measures the held-out pairs, which it reads again from the file.
    let pictures = tmp.path().join("heads");
    let o =
        attn(&["explain", "heads", dir.to_str().unwrap(), "--samples", "5", "--out-dir", pictures.to_str().unwrap()]);
    one_line_error(&o, &["pairs.tsv", "changed"]);
}

#[test]
fn resume_says_where_it_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    assert!(train(&dir, &["--steps", "10"]).status.success());
    let o = attn(&["train", "--out", dir.to_str().unwrap(), "--resume", "--steps", "20"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("resuming from step 10 (of 20)"), "{}", text(&o.stdout));
}

#[test]
fn edited_heads_and_vocab_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    assert!(train(&dir, &["--steps", "10"]).status.success());
    let d = dir.to_str().unwrap();
    // 4 heads of width 4 fit the same weights as 2 of width 8: only the record of the run tells.
    edit(&dir.join("config.json"), "\"heads\": 2", "\"heads\": 4");
    one_line_error(&attn(&["train", "--out", d, "--resume", "--steps", "20"]), &["config.json", "heads"]);
    one_line_error(&attn(&["translate", "--checkpoint", d, "3 March 2021"]), &["config.json", "heads"]);
    edit(&dir.join("config.json"), "\"heads\": 4", "\"heads\": 2");
    // One character replaced by the next one up: still a well-formed vocabulary of the same size.
    let path = dir.join("vocab.json");
    let mut vocab: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let chars = vocab["chars"].as_array_mut().unwrap();
    let last = chars.last().unwrap().as_str().unwrap().chars().next().unwrap();
    *chars.last_mut().unwrap() = char::from_u32(last as u32 + 1).unwrap().to_string().into();
    std::fs::write(&path, serde_json::to_string(&vocab).unwrap()).unwrap();
    one_line_error(&attn(&["translate", "--checkpoint", d, "3 March 2021"]), &["vocab.json"]);
    one_line_error(&attn(&["train", "--out", d, "--resume", "--steps", "20"]), &["vocab.json"]);
}

#[test]
fn out_refuses_a_folder_with_files_the_trainer_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), b"the user's own weights").unwrap();
    let o = train(&dir, &["--steps", "5"]);
    one_line_error(&o, &["--out", "model.safetensors"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), b"the user's own weights");
    assert!(!dir.join("config.json").exists());

    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("config.json"), b"{\"name\": \"my project\"}").unwrap();
    let o = train(&other, &["--steps", "5"]);
    one_line_error(&o, &["--out", "config.json"]);
    assert!(!text(&o.stderr).contains("already holds a checkpoint"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(other.join("config.json")).unwrap(), b"{\"name\": \"my project\"}");

    // A checkpoint of attn train is still pointed to --resume.
    let run = tmp.path().join("run");
    assert!(train(&run, &["--steps", "5"]).status.success());
    one_line_error(&train(&run, &["--steps", "5"]), &["already holds a checkpoint", "--resume"]);
}

#[test]
fn the_held_out_default_is_a_fraction_of_the_pairs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("pairs.tsv");
    write_pairs(&data, 60);
    // TINY without its `--held-out 20`.
    let tiny: Vec<&str> = TINY.iter().copied().filter(|&a| a != "--held-out" && a != "20").collect();
    let run = |dir: &str, data: &Path| {
        let args = [&["train", "--out", dir, "--steps", "5", "--data", data.to_str().unwrap()][..], &tiny].concat();
        attn(&args)
    };
    let dir = tmp.path().join("m");
    let o = run(dir.to_str().unwrap(), &data);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let first = text(&o.stdout).lines().next().unwrap_or_default().to_string();
    assert!(first.contains("3 of the 60 pairs") && first.contains("5%"), "{first}");

    let one = tmp.path().join("one.tsv");
    std::fs::write(&one, "abc\tcba\n").unwrap();
    let o = run(tmp.path().join("m1").to_str().unwrap(), &one);
    one_line_error(&o, &["--held-out", "one.tsv holds 1 pair"]);
    assert!(!text(&o.stderr).contains("split_held_out"), "{}", text(&o.stderr));
}

#[test]
fn os_errors_are_said_once() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.tsv");
    let o = train(&tmp.path().join("m"), &["--steps", "5", "--data", missing.to_str().unwrap()]);
    one_line_error(&o, &["nope.tsv", "(os error 2)"]);
    assert_eq!(text(&o.stderr).matches("(os error 2)").count(), 1, "{}", text(&o.stderr));
}

#[test]
fn ctrl_c_saves_once_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let mut args = vec!["train", "--out", dir.to_str().unwrap(), "--steps", "100000"];
    args.extend(TINY);
    let mut child =
        Command::new(env!("CARGO_BIN_EXE_attn")).args(&args).stdout(Stdio::piped()).spawn().expect("attn starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let saved = line.contains("checkpoint saved");
        seen.push(line);
        if saved {
            break;
        }
    }
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    seen.extend(lines.map(Result::unwrap));
    let deadline = Instant::now() + Duration::from_secs(120);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running two minutes after Ctrl-C: {seen:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(130), "{seen:?}");
    let saved: Vec<&String> = seen.iter().filter(|l| l.contains("checkpoint saved")).collect();
    let step = checkpoint_step(&dir);
    let at_step = |l: &&&String| l.starts_with(&format!("step {step:>6}:"));
    assert_eq!(saved.iter().filter(at_step).count(), 1, "{seen:?}");
    let last = seen.last().unwrap();
    assert!(last.contains(&format!("stopped at step {step}")), "{last}");
    assert!(last.contains(&format!("saved at step {step}")), "{last}");
    let evaluated = step - step % 10;
    assert!(last.contains(&format!("from step {evaluated}")), "{last}");
}

/// The step `config.json` of the checkpoint in `dir` records.
fn checkpoint_step(dir: &Path) -> u64 {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    manifest["step"].as_u64().unwrap()
}
