//! How `attn run` and `attn heatmap` write their files: never over one of their inputs (the same
//! path, a link to it or another name of it), with the mode a plainly created file gets under the
//! umask (an existing file keeps its own), whole or not at all, and with errors that name the
//! destination the user gave rather than an internal temporary file.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A small valid input `in.safetensors` in `dir`.
fn small_input(dir: &Path) -> PathBuf {
    let t = f32_tensor(&[1, 1, 3, 2], 1);
    let input = dir.join("in.safetensors");
    write(&input, &[("q", &t), ("k", &t), ("v", &t)]);
    input
}

/// A small weights file `w.safetensors` in `dir`, for `attn heatmap`.
fn weights_input(dir: &Path) -> PathBuf {
    let w = tensor(&[2, 2], HostData::F32(vec![0.25, 0.75, 0.5, 0.5]));
    let input = dir.join("w.safetensors");
    write(&input, &[("weights", &w)]);
    input
}

/// The stderr of `attn heatmap INPUT -o OUTPUT`, which must fail with exit code 1.
fn heatmap_error(input: &Path, output: &Path) -> String {
    let o = attn_in_shell("true", &["heatmap", input.to_str().unwrap(), "-o", output.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    stderr
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    n.sort();
    n
}

#[test]
fn run_refuses_to_write_over_its_safetensors_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let before = std::fs::read(&input).unwrap();
    let hard = dir.path().join("hard.safetensors");
    std::fs::hard_link(&input, &hard).unwrap();
    let soft = dir.path().join("soft.safetensors");
    std::os::unix::fs::symlink(&input, &soft).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let dotted = dir.path().join("sub/../in.safetensors");
    for out in [&input, &hard, &soft, &dotted] {
        let e = run_err(&["-o", out.to_str().unwrap()], &[&input]);
        assert!(e.contains(&format!("{}: is the input file {}", out.display(), input.display())), "{e}");
        assert!(e.contains("choose another --output"), "{e}");
        assert_eq!(std::fs::read(&input).unwrap(), before, "input changed by -o {}", out.display());
    }
}

#[test]
fn run_refuses_to_write_over_any_npy_input() {
    let dir = tempfile::tempdir().unwrap();
    let t = f32_tensor(&[1, 1, 3, 2], 2);
    let mask = tensor(&[3], HostData::Bool(vec![true, false, true]));
    let args = npy_args(dir.path(), &[("q", &t), ("k", &t), ("v", &t), ("mask", &mask), ("grad_out", &t)]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    for name in ["q", "k", "v", "mask", "grad_out"] {
        let target = dir.path().join(format!("{name}.npy"));
        let before = std::fs::read(&target).unwrap();
        let e = run_err(&[&args[..], &["-o", target.to_str().unwrap()]].concat(), &[]);
        assert!(e.contains(&format!("is the input file {}", target.display())), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), before, "{name}.npy changed");
    }
}

#[test]
fn heatmap_refuses_to_draw_over_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = weights_input(dir.path());
    let before = std::fs::read(&input).unwrap();
    let stderr = heatmap_error(&input, &input);
    assert!(stderr.contains("is the input file"), "{stderr}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
}

#[test]
fn outputs_get_the_mode_of_a_plainly_created_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let weights = weights_input(dir.path());
    for (umask, want) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
        let out = dir.path().join(format!("out-{umask}.safetensors"));
        let o =
            attn_in_shell(&format!("umask {umask}"), &["run", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(mode(&out), want, "run under umask {umask}");
        let png = dir.path().join(format!("h-{umask}.png"));
        let o = attn_in_shell(
            &format!("umask {umask}"),
            &["heatmap", weights.to_str().unwrap(), "-o", png.to_str().unwrap()],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(mode(&png), want, "heatmap under umask {umask}");
    }
}

#[test]
fn an_existing_output_keeps_its_mode_and_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let out = out_path(dir.path());
    std::fs::write(&out, b"old contents, longer than nothing").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    let o = attn_in_shell("umask 022", &["run", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode(&out), 0o640);
    let written = read_safetensors(&out).unwrap();
    assert_eq!(written.keys().collect::<Vec<_>>(), ["lse", "out"]);
    assert_eq!(names(dir.path()), ["in.safetensors", "out.safetensors"], "a temporary file was left behind");
}

#[test]
fn an_unwritable_destination_is_named_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let input = small_input(dir.path());
    let weights = weights_input(dir.path());
    // A folder that does not exist, and a "folder" that is a file (refused even for root).
    for out in [dir.path().join("missing/out.safetensors"), dir.path().join("in.safetensors/out.safetensors")] {
        let e = run_err(&["-o", out.to_str().unwrap()], &[&input]);
        // Only the system's reason follows the destination: no other (temporary) path.
        let reason = e.trim_end().strip_prefix(&format!("error: {}: cannot write: ", out.display()));
        assert!(reason.is_some_and(|r| !r.contains('/')), "{e}");
        let png = out.with_extension("png");
        let stderr = heatmap_error(&weights, &png);
        let (_, reason) = stderr.trim_end().split_once(&format!("{}: cannot write", png.display())).unwrap();
        assert!(!reason.contains('/'), "{stderr}");
    }
    assert_eq!(names(dir.path()), ["in.safetensors", "w.safetensors"]);
}
