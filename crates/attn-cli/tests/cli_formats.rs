//! File formats at the command line: `attn run` reads a `.npz` archive as it reads a safetensors
//! file (NumPy's own archives included) and tells a `.npy` input apart instead of misreading it;
//! every output is written in the format its extension names (`attn run`: safetensors or `.npz`;
//! pictures: PNG, SVG or JPEG), and an extension no writer knows is refused before any input is
//! read, with the accepted extensions named.

use crate::common;

use attn_cli::io::{read_npz, read_tensors, write_npz};
use common::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Runs `attn ARGS`, which must fail with exit code 1 and one `error:` line containing every
/// string of `wanted`; returns that line.
fn refused(args: &[&str], wanted: &[&str]) -> String {
    assert_refused(args, Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().unwrap(), wanted)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn npy_file_given_as_the_input_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("q.npy");
    write_npy(&q, &f32_tensor(&[1, 1, 2, 2], 1)).unwrap();
    let out = dir.path().join("x.st");
    let e = refused(&["run", s(&q), "-o", s(&out)], &[s(&q), "a .npy file holds one unnamed array", "--q, --k, --v"]);
    assert!(!e.contains("header length"), "{e}");
    assert!(!out.exists());
}

#[test]
fn numpy_archives_are_inputs_like_safetensors_files() {
    let dir = tempfile::tempdir().unwrap();
    let same = dir.path().join("same.safetensors");
    let tensors = read_npz(&fixture("numpy_savez.npz")).unwrap();
    write(&same, &tensors.iter().map(|(n, t)| (n.as_str(), t)).collect::<Vec<_>>());
    let want_out = dir.path().join("want.safetensors");
    let (want, _) = run_ok(&["--weights", "-o", s(&want_out)], &[&same], &want_out);
    assert_eq!(want["out"].shape, [1, 2, 3, 2]); // [B, Hq, Lq, Dv] of q and v
    for name in ["numpy_savez.npz", "numpy_savez_compressed.npz"] {
        let out = dir.path().join(format!("{name}.safetensors"));
        let (got, stdout) = run_ok(&["--weights", "-o", s(&out)], &[&fixture(name)], &out);
        assert_eq!(got, want, "{name}");
        assert!(stdout.contains("mask [3, 3] BOOL") && stdout.contains("key_lengths [1] I64"), "{stdout}");
    }
}

#[test]
fn archive_members_are_checked_like_safetensors_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.npz");
    let t = f32_tensor(&[1, 1, 2, 2], 1);
    write_npz(&input, &[("q", &t), ("k", &t), ("v", &t), ("values", &t)]).unwrap();
    let out = dir.path().join("out.npz");
    refused(&["run", s(&input), "-o", s(&out)], &[s(&input), "tensor 'values': unknown tensor name"]);
    write_npz(&input, &[("q", &t), ("k", &t)]).unwrap();
    refused(&["run", s(&input), "-o", s(&out)], &[s(&input), "tensor 'v': missing; found k, q"]);
    // Recognised by content whatever its name.
    let renamed = dir.path().join("in.safetensors");
    std::fs::copy(&input, &renamed).unwrap();
    refused(&["run", s(&renamed), "-o", s(&out)], &[s(&renamed), "tensor 'v': missing; found k, q"]);
    assert!(!out.exists());
}

#[test]
fn run_writes_the_format_its_extension_names() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    let (q, k, v) = (f32_tensor(&[1, 2, 3, 4], 1), f32_tensor(&[1, 2, 5, 4], 2), f32_tensor(&[1, 2, 5, 3], 3));
    write(&input, &[("q", &q), ("k", &k), ("v", &v)]);
    let st = dir.path().join("out.safetensors");
    let (want, _) = run_ok(&["--weights", "-o", s(&st)], &[&input], &st);
    for name in ["out.npz", "OUT.NPZ"] {
        let npz = dir.path().join(name);
        attn_ok(&["--weights", "-o", s(&npz)], &input);
        assert!(std::fs::read(&npz).unwrap().starts_with(b"PK\x03\x04"), "{name} is not a zip archive");
        assert_eq!(read_npz(&npz).unwrap(), want, "{name}");
    }
    let short = dir.path().join("out.ST");
    attn_ok(&["--weights", "-o", s(&short)], &input);
    assert_eq!(read_safetensors(&short).unwrap(), want);
    assert_eq!(read_tensors(&short).unwrap(), want);
}

fn attn_ok(args: &[&str], input: &Path) {
    let o = attn(args, &[input]);
    assert!(o.status.success(), "attn run failed: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn unknown_output_extensions_are_refused_before_reading_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.safetensors");
    let o = |name: &str| dir.path().join(name);
    let accepted = ".safetensors, .st or .npz";
    let e = refused(&["run", s(&absent), "-o", s(&o("out.npy"))], &["out.npy", "several tensors", accepted]);
    assert!(!e.contains("absent"), "{e}");
    refused(&["run", s(&absent), "-o", s(&o("out.txt"))], &["out.txt", "unknown extension '.txt'", accepted]);
    refused(&["run", s(&absent), "-o", s(&o("out"))], &["no extension", accepted]);
    let pictures = ".png, .svg, .jpg or .jpeg";
    let e = refused(&["heatmap", s(&absent), "-o", s(&o("h.gif"))], &["h.gif", "'.gif'", pictures]);
    assert!(!e.contains("absent"), "{e}");
    refused(&["heatmap", s(&absent), "-o", s(&o("heat"))], &["no picture extension", pictures]);
    let checkpoint = s(&absent);
    let e = refused(
        &["translate", "--checkpoint", checkpoint, "--heatmap", s(&o("t.bmp")), "x"],
        &["--heatmap", "t.bmp", "'.bmp'", pictures],
    );
    assert!(!e.contains("absent"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a refused command wrote a file");
}

#[test]
fn heatmap_writes_png_svg_and_jpeg_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("w.safetensors");
    write(&input, &[("weights", &f32_tensor(&[3, 3], 1))]);
    let starts: [(&str, &[u8]); 5] = [
        ("h.png", b"\x89PNG\r\n\x1a\n"),
        ("h.svg", b"<svg"),
        ("h.jpg", b"\xff\xd8\xff"),
        ("h.JPEG", b"\xff\xd8\xff"),
        ("h.Png", b"\x89PNG\r\n\x1a\n"),
    ];
    for (name, magic) in starts {
        let out = dir.path().join(name);
        let o = Command::new(env!("CARGO_BIN_EXE_attn")).args(["heatmap", s(&input), "-o", s(&out)]).output().unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let bytes = std::fs::read(&out).unwrap();
        assert!(bytes.starts_with(magic), "{name} starts with {:?}", &bytes[..8.min(bytes.len())]);
    }
}
