//! `attn heatmap` end to end: weights written by `attn run --weights` (or directly, in each float
//! type and rank) are drawn to PNG and SVG; the SVG's cell texts show that the requested batch entry
//! and head were drawn, with the tokens and title; `--all-heads` draws one panel per head; every
//! bad request gives exit code 1 with one `error:` line naming file and tensor, and no picture.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use attn_cli::io::{read_safetensors, read_tensors, write_safetensors, HostData};
use half::{bf16, f16};

use crate::common;

use common::{tensor, values};

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn")).args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stdout_of(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Runs `attn run --weights` on random `q, k, v: [2, 3, L, 8]` (`Lq`, `Lk`) in `dir`; returns
/// the output file.
fn run_weights(dir: &Path, lq: usize, lk: usize) -> PathBuf {
    let input = dir.join("qkv.safetensors");
    let q = tensor(&[2, 3, lq, 8], HostData::F32(values(2 * 3 * lq * 8, 1)));
    let k = tensor(&[2, 3, lk, 8], HostData::F32(values(2 * 3 * lk * 8, 2)));
    let v = tensor(&[2, 3, lk, 8], HostData::F32(values(2 * 3 * lk * 8, 3)));
    write_safetensors(&input, &[("q", &q), ("k", &k), ("v", &v)]).unwrap();
    let output = dir.join("attn-out.safetensors");
    stdout_of(&attn(&["run", s(&input), "-o", s(&output), "--weights"]));
    output
}

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", path.display());
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk of {}", path.display());
    let size =
        (u32::from_be_bytes(bytes[16..20].try_into().unwrap()), u32::from_be_bytes(bytes[20..24].try_into().unwrap()));
    assert!(size.0 > 0 && size.1 > 0, "{} is {size:?}", path.display());
    size
}

/// The texts of an SVG's `<text>` elements.
fn svg_texts(path: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(path).unwrap();
    svg.split("<text")
        .skip(1)
        .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].trim().to_string())
        .collect()
}

/// The texts of the cells of `weights: [B, H, Lq, Lk]` at batch `b`, head `h`.
fn cell_texts(w: &[f32], dims: [usize; 4], b: usize, h: usize) -> Vec<String> {
    let n = dims[2] * dims[3];
    let start = (b * dims[1] + h) * n;
    w[start..start + n].iter().map(|x| format!("{x:.2}")).collect()
}

#[test]
fn run_output_becomes_png_and_svg_of_the_chosen_head_with_tokens_and_title() {
    let dir = tempfile::tempdir().unwrap();
    let weights_file = run_weights(dir.path(), 4, 4);
    let weights = read_safetensors(&weights_file).unwrap()["weights"].to_f32_vec().unwrap();
    let common = [s(&weights_file), "--batch", "1", "--head", "2", "--tokens", "the  cat sat\tdown"];

    let png = dir.path().join("heat.png");
    let stdout = stdout_of(&attn(&[&["heatmap"], &common[..], &["-o", s(&png)]].concat()));
    assert!(stdout.contains(s(&png)), "stdout: {stdout}");
    png_size(&png);

    let svg = dir.path().join("heat.svg");
    stdout_of(&attn(&[&["heatmap"], &common[..], &["--title", "Cats & attention", "-o", s(&svg)]].concat()));
    let texts = svg_texts(&svg);
    for wanted in ["the", "cat", "sat", "down", "Cats &amp; attention"] {
        assert!(texts.iter().any(|t| t == wanted), "{wanted:?} not among {texts:?}");
    }
    for cell in cell_texts(&weights, [2, 3, 4, 4], 1, 2) {
        assert!(texts.contains(&cell), "cell {cell} not among {texts:?}");
    }
}

#[test]
fn picks_batch_and_head_in_every_rank_and_float_type() {
    let dir = tempfile::tempdir().unwrap();
    // Cell texts 0.30 ..= 0.53 are distinct for every (batch, head, cell); colour-bar ticks have 1 decimal.
    let w: Vec<f32> = (0..24).map(|i| 0.303 + 0.01 * i as f32).collect();
    let file = dir.path().join("w.safetensors");
    let w4 = tensor(&[2, 3, 2, 2], HostData::F64(w.iter().map(|&x| f64::from(x)).collect()));
    let w3 = tensor(&[3, 2, 2], HostData::F16(w[12..].iter().map(|&x| f16::from_f32(x)).collect()));
    let w2 = tensor(&[2, 2], HostData::Bf16(w[20..].iter().map(|&x| bf16::from_f32(x)).collect()));
    write_safetensors(&file, &[("w4", &w4), ("w3", &w3), ("w2", &w2)]).unwrap();
    // (tensor, flags, its values as f32, its dims as [B, H, Lq, Lk], (batch, head) picked, title)
    type Case<'a> = (&'a str, &'a [&'a str], Vec<f32>, [usize; 4], (usize, usize), &'a str);
    let cases: [Case; 3] = [
        ("w4", &["--batch", "1", "--head", "1"], w.clone(), [2, 3, 2, 2], (1, 1), "w4, batch 1, head 1"),
        ("w3", &["--head", "2"], w3.to_f32_vec().unwrap(), [1, 3, 2, 2], (0, 2), "w3, head 2"),
        ("w2", &[], w2.to_f32_vec().unwrap(), [1, 1, 2, 2], (0, 0), "w2"),
    ];
    for (name, flags, data, dims, picked, title) in cases {
        let svg = dir.path().join(format!("{name}.svg"));
        stdout_of(&attn(&[&["heatmap", s(&file), "--tensor", name, "-o", s(&svg)], flags].concat()));
        let texts = svg_texts(&svg);
        assert!(texts.iter().any(|t| t == title), "title {title:?} not among {texts:?}");
        for b in 0..dims[0] {
            for h in 0..dims[1] {
                for cell in cell_texts(&data, dims, b, h) {
                    let drawn = texts.contains(&cell);
                    assert_eq!(drawn, (b, h) == picked, "{name}: cell {cell} of batch {b} head {h}, drawn {drawn}");
                }
            }
        }
    }
}

#[test]
fn all_heads_draws_one_panel_per_head_with_query_and_key_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let weights_file = run_weights(dir.path(), 3, 5);
    let tokens = ["--query-tokens", "q1 q2 q3", "--key-tokens", "k1 k2 k3 k4 k5"];
    let one = dir.path().join("one.png");
    stdout_of(&attn(&[&["heatmap", s(&weights_file), "-o", s(&one)], &tokens[..]].concat()));
    let grid = dir.path().join("grid.png");
    let stdout =
        stdout_of(&attn(&[&["heatmap", s(&weights_file), "--all-heads", "-o", s(&grid)], &tokens[..]].concat()));
    assert!(stdout.contains("all 3 heads") && stdout.contains(s(&grid)), "stdout: {stdout}");
    let (one, grid) = (png_size(&one), png_size(&grid));
    assert!(grid.0 * grid.1 > 2 * one.0 * one.1, "grid {grid:?} vs single {one:?}");

    let svg = dir.path().join("grid.svg");
    stdout_of(&attn(
        &[&["heatmap", s(&weights_file), "--all-heads", "--batch", "1", "-o", s(&svg)], &tokens[..]].concat(),
    ));
    let texts = svg_texts(&svg);
    for wanted in ["head 0", "head 1", "head 2", "q3", "k5"] {
        assert!(texts.iter().any(|t| t == wanted), "{wanted:?} not among {texts:?}");
    }
    assert!(!texts.iter().any(|t| t == "head 3"), "{texts:?}");
}

/// Runs `attn heatmap ARGS -o OUT` and checks it fails with one `error:` line containing every
/// string of `wanted`, without writing OUT.
fn refused(dir: &Path, args: &[&str], wanted: &[&str]) {
    let out_file = dir.join("refused.png");
    common::assert_refused(args, attn(&[&["heatmap"], args, &["-o", s(&out_file)]].concat()), wanted);
    assert!(!out_file.exists(), "{args:?} wrote {}", out_file.display());
}

#[test]
fn bad_requests_are_one_line_errors_naming_file_tensor_expected_and_found() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run_out = run_weights(d, 4, 4);
    let f = s(&run_out);
    refused(d, &[f, "--tensor", "attn"], &[f, "tensor 'attn'", "missing", "lse, mask, out, weights"]);
    refused(d, &[f, "--batch", "2"], &[f, "tensor 'weights'", "--batch 2", "[2, 3, 4, 4]", "0 to 1"]);
    refused(d, &[f, "--head", "3"], &[f, "tensor 'weights'", "--head 3", "0 to 2"]);
    refused(d, &[f, "--tokens", "a b c"], &[f, "tensor 'weights'", "--tokens has 3 tokens", "Lq = Lk = 4"]);
    refused(d, &[f, "--query-tokens", "a b"], &[f, "--query-tokens has 2 tokens", "Lq = 4"]);
    refused(d, &[f, "--key-tokens", "a b c d e"], &[f, "--key-tokens has 5 tokens", "Lk = 4"]);

    let no_weights = d.join("no-weights.safetensors");
    let qkv = d.join("qkv.safetensors");
    stdout_of(&attn(&["run", s(&qkv), "-o", s(&no_weights)]));
    refused(d, &[s(&no_weights)], &[s(&no_weights), "tensor 'weights'", "missing", "lse, out", "--weights"]);

    let rect_dir = d.join("rect");
    std::fs::create_dir(&rect_dir).unwrap();
    let rect = run_weights(&rect_dir, 3, 5);
    refused(d, &[s(&rect), "--tokens", "a b c"], &["Lq = 3", "Lk = 5", "--query-tokens and --key-tokens"]);

    let odd = d.join("odd.safetensors");
    let f32s = |shape: &[usize]| tensor(shape, HostData::F32(vec![0.5; shape.iter().product()]));
    let (rank1, rank5, empty, square) = (f32s(&[4]), f32s(&[1, 1, 1, 2, 2]), f32s(&[2, 0, 3]), f32s(&[2, 2]));
    let ints = tensor(&[2, 2], HostData::I64(vec![1, 2, 3, 4]));
    let no_heads = f32s(&[1, 0, 2, 2]);
    write_safetensors(
        &odd,
        &[
            ("rank1", &rank1),
            ("rank5", &rank5),
            ("empty", &empty),
            ("ints", &ints),
            ("no_heads", &no_heads),
            ("square", &square),
        ],
    )
    .unwrap();
    let o = s(&odd);
    let ranks = "expected rank 2 [Lq, Lk], 3 [H, Lq, Lk] or 4 [B, H, Lq, Lk]";
    refused(d, &[o, "--tensor", "rank1"], &[o, "tensor 'rank1'", "shape [4]", ranks]);
    refused(d, &[o, "--tensor", "rank5"], &[o, "tensor 'rank5'", "shape [1, 1, 1, 2, 2]", ranks]);
    refused(d, &[o, "--tensor", "empty"], &[o, "tensor 'empty'", "shape [2, 0, 3]", "Lq > 0"]);
    refused(d, &[o, "--tensor", "ints"], &[o, "tensor 'ints'", "dtype I64", "F32"]);
    refused(d, &[o, "--tensor", "no_heads", "--all-heads"], &[o, "tensor 'no_heads'", "H > 0"]);
    refused(d, &[o, "--tensor", "no_heads"], &[o, "--head 0", "none, as H is 0"]);
    refused(d, &[o, "--tensor", "square", "--head", "1"], &[o, "--head 1", "0, as [Lq, Lk] has no H dimension"]);
    refused(d, &[o, "--tensor", "square", "--batch", "1"], &[o, "--batch 1", "0, as [Lq, Lk] has no B dimension"]);

    let absent = d.join("absent.safetensors");
    refused(d, &[s(&absent)], &[s(&absent), "cannot read"]);
}

#[test]
fn masked_cells_are_drawn_apart_from_zero_weights() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("qkv.safetensors");
    let t = |seed| tensor(&[1, 2, 4, 8], HostData::F32(values(64, seed)));
    write_safetensors(&input, &[("q", &t(1)), ("k", &t(2)), ("v", &t(3))]).unwrap();
    for name in ["causal.safetensors", "causal.npz"] {
        let output = dir.path().join(name);
        stdout_of(&attn(&["run", s(&input), "-o", s(&output), "--weights", "--causal"]));
        let svg = dir.path().join(format!("{name}.svg"));
        stdout_of(&attn(&["heatmap", s(&output), "--head", "1", "-o", s(&svg)]));
        let texts = svg_texts(&svg);
        // The 6 cells above the diagonal are masked: no value, and a legend entry, where they
        // were drawn as "0.00" like weights that happen to be tiny.
        assert!(texts.iter().any(|t| t == "masked"), "{name}: no 'masked' legend in {texts:?}");
        assert!(!texts.iter().any(|t| t == "0.00"), "{name}: {texts:?}");
        let w = read_tensors(&output).unwrap()["weights"].to_f32_vec().unwrap();
        let cells = cell_texts(&w, [1, 2, 4, 4], 0, 1);
        for (at, cell) in cells.iter().enumerate().filter(|(at, _)| at % 4 <= at / 4) {
            assert!(texts.contains(cell), "{name}: kept cell {at} ({cell}) not among {texts:?}");
        }
    }
    // Without a mask in the file the same weights show their zeros.
    let bare = dir.path().join("bare.safetensors");
    let weights = read_safetensors(&dir.path().join("causal.safetensors")).unwrap().remove("weights").unwrap();
    write_safetensors(&bare, &[("weights", &weights)]).unwrap();
    let svg = dir.path().join("bare.svg");
    stdout_of(&attn(&["heatmap", s(&bare), "-o", s(&svg)]));
    let texts = svg_texts(&svg);
    assert_eq!(texts.iter().filter(|t| *t == "0.00").count(), 6, "{texts:?}");
    assert!(!texts.iter().any(|t| t == "masked"), "{texts:?}");
}

#[test]
fn tensors_other_than_weights_get_neutral_axis_titles() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_weights(dir.path(), 4, 4);
    let svg = dir.path().join("out.svg");
    stdout_of(&attn(&["heatmap", s(&output), "--tensor", "out", "-o", s(&svg)]));
    let texts = svg_texts(&svg);
    assert!(texts.iter().any(|t| t == "Row") && texts.iter().any(|t| t == "Column"), "{texts:?}");
    assert!(!texts.iter().any(|t| t == "Key" || t == "Query" || t == "masked"), "{texts:?}");
    let weights = dir.path().join("weights.svg");
    stdout_of(&attn(&["heatmap", s(&output), "-o", s(&weights)]));
    let texts = svg_texts(&weights);
    assert!(texts.iter().any(|t| t == "Key") && texts.iter().any(|t| t == "Query"), "{texts:?}");
}

#[test]
fn a_mask_that_does_not_fit_the_weights_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w.safetensors");
    let weights = tensor(&[2, 3], HostData::F32(vec![0.5; 6]));
    let mask = tensor(&[2], HostData::Bool(vec![true, false]));
    write_safetensors(&file, &[("weights", &weights), ("mask", &mask)]).unwrap();
    refused(dir.path(), &[s(&file)], &[s(&file), "tensor 'mask'", "[2]", "[2, 3]"]);
}

#[test]
fn unwritable_output_is_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = run_weights(dir.path(), 2, 2);
    let target = dir.path().join("no-such-folder").join("heat.png");
    let out = attn(&["heatmap", s(&file), "-o", s(&target)]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "stderr {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr {stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(s(&target)), "stderr {stderr}");
}
