//! `attn demo` end to end: the worked example's numbers, recomputed here in `f64` from the
//! formula, appear in order; the padded batch shows zero weights on padded keys; the heatmap
//! PNGs are written, the padded batch's with its padded keys drawn as masked.

use std::process::Command;

type Matrix = Vec<Vec<f64>>;

fn matmul(a: &Matrix, b: &Matrix) -> Matrix {
    a.iter().map(|row| (0..b[0].len()).map(|j| row.iter().zip(b).map(|(x, br)| x * br[j]).sum()).collect()).collect()
}

fn transpose(a: &Matrix) -> Matrix {
    (0..a[0].len()).map(|j| a.iter().map(|row| row[j]).collect()).collect()
}

fn softmax_rows(a: &Matrix, scale: f64) -> Matrix {
    a.iter()
        .map(|row| {
            let e: Vec<f64> = row.iter().map(|s| (s * scale).exp()).collect();
            let total: f64 = e.iter().sum();
            e.iter().map(|x| x / total).collect()
        })
        .collect()
}

fn m(rows: &[&[f64]]) -> Matrix {
    rows.iter().map(|r| r.to_vec()).collect()
}

/// Index after the first run of consecutive lines, at or after `from`, whose trailing
/// whitespace-separated tokens are `expected`'s rows printed with 4 decimals.
fn find_rows(lines: &[&str], from: usize, expected: &Matrix, what: &str) -> usize {
    let wanted: Vec<Vec<String>> = expected.iter().map(|r| r.iter().map(|x| format!("{x:.4}")).collect()).collect();
    let matches = |line: &str, row: &[String]| {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        tokens.len() >= row.len() && tokens[tokens.len() - row.len()..].iter().zip(row).all(|(t, w)| t == w)
    };
    (from..lines.len())
        .find(|&i| wanted.iter().enumerate().all(|(r, row)| lines.get(i + r).is_some_and(|l| matches(l, row))))
        .map(|i| i + wanted.len())
        .unwrap_or_else(|| panic!("{what} {wanted:?} not found after line {from} in:\n{}", lines.join("\n")))
}

#[test]
fn demo_prints_the_worked_example_and_writes_a_heatmap() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("figures");
    let output = Command::new(env!("CARGO_BIN_EXE_attn")).arg("demo").arg("--out-dir").arg(&out_dir).output().unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "stderr: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();

    let x = m(&[&[1., 0., 1., 0.], &[0., 2., 0., 2.], &[1., 1., 1., 1.]]);
    let w_k = m(&[&[0., 0., 1.], &[1., 1., 0.], &[0., 1., 0.], &[1., 1., 0.]]);
    let w_q = m(&[&[1., 0., 1.], &[1., 0., 0.], &[0., 0., 1.], &[0., 1., 1.]]);
    let w_v = m(&[&[0., 2., 0.], &[0., 3., 0.], &[1., 0., 3.], &[1., 1., 0.]]);
    let (keys, queries, values) = (matmul(&x, &w_k), matmul(&x, &w_q), matmul(&x, &w_v));
    let scores = matmul(&queries, &transpose(&keys));
    let mut at = find_rows(&lines, 0, &keys, "keys");
    at = find_rows(&lines, at, &queries, "queries");
    at = find_rows(&lines, at, &values, "values");
    at = find_rows(&lines, at, &scores, "raw scores");
    for scale in [1.0, 1.0 / 3f64.sqrt()] {
        let weights = softmax_rows(&scores, scale);
        at = find_rows(&lines, at, &weights, &format!("weights at scale {scale}"));
        at = find_rows(&lines, at, &matmul(&weights, &values), &format!("outputs at scale {scale}"));
    }

    // Example 2: the first query's 7 weights, the last two keys padded.
    let row = lines[at..]
        .iter()
        .map(|l| l.split_whitespace().filter_map(|t| t.parse::<f64>().ok()).collect::<Vec<_>>())
        .find(|nums| nums.len() == 7)
        .unwrap_or_else(|| panic!("no 7-key weight row in:\n{stdout}"));
    assert!(row[..5].iter().all(|&w| w > 0.0) && row[5..] == [0.0, 0.0], "weights {row:?}");
    assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-3, "weights {row:?}");
    for shape in ["[2, 2, 5, 64]", "[2, 2, 7, 128]", "[2, 1, 1, 7]", "[2, 2, 5, 128]", "[2, 2, 5, 7]"] {
        assert!(stdout.contains(shape), "shape {shape} missing in:\n{stdout}");
    }

    // Step 3: the heatmap PNGs; the padded batch's shows its 2 padded keys × 5 queries × 2 heads
    // as masked cells (light grey), which example 1's, with nothing masked, does not have (a few
    // anti-aliased text pixels may share the colour).
    let masked_px = |name: &str| {
        let png = out_dir.join(name);
        assert!(stdout.contains(&png.display().to_string()), "{name} not reported in:\n{stdout}");
        let img = image::load_from_memory_with_format(&std::fs::read(&png).unwrap(), image::ImageFormat::Png);
        img.unwrap().to_rgb8().pixels().filter(|p| p.0 == MASKED).count()
    };
    assert!(masked_px("attn-demo-heatmap.png") < 500);
    let masked = masked_px("attn-demo-padded.png");
    assert!(masked > 20 * 500, "{masked} masked px for 20 masked cells");
}

/// Fill colour of masked heatmap cells.
const MASKED: [u8; 3] = [228, 228, 228];

#[test]
fn demo_writes_its_heatmap_where_the_user_is_and_checks_out_dir_first() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_attn")).arg("demo").current_dir(dir.path()).output().unwrap();
    assert!(output.status.success(), "stderr: {}", String::from_utf8_lossy(&output.stderr));
    assert!(dir.path().join("attn-demo-heatmap.png").is_file(), "no heatmap in the current folder");

    // A folder that cannot be created (below a plain file): one line, exit 1, nothing printed.
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("figures");
    let output = Command::new(env!("CARGO_BIN_EXE_attn")).arg("demo").arg("--out-dir").arg(&bad).output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(output.stdout.is_empty(), "the walk-through was printed before the failure");
    assert!(stderr.contains("--out-dir") && stderr.contains("figures"), "{stderr}");
}
