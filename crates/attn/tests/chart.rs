//! Line charts: PNG and SVG are written with every series in the legend, logarithmic axes drop
//! points they cannot show, a chart with nothing drawable is refused without writing a file, and
//! the fitted log-log slope recovers power laws.

use attn::chart::{draw_lines, log_log_slope, LineChart, Series};

fn chart(log_y: bool, points: Vec<(f64, f64)>) -> LineChart {
    LineChart {
        title: "time over length".into(),
        x_label: "L".into(),
        y_label: "ms".into(),
        log_x: true,
        log_y,
        series: vec![
            Series { name: "additive".into(), points: points.clone() },
            Series { name: "dot-product".into(), points: points.iter().map(|&(x, y)| (x, y / 2.0)).collect() },
        ],
    }
}

#[test]
fn png_and_svg_are_written_with_the_legend() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("c.png");
    draw_lines(&png, &chart(true, vec![(64.0, 1.0), (128.0, 4.0), (256.0, 16.0)])).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    if let Ok(keep) = std::env::var("ATTN_KEEP_CHART") {
        std::fs::copy(&png, keep).unwrap();
    }
    let svg = dir.path().join("c.SVG");
    draw_lines(&svg, &chart(false, vec![(64.0, 1.0), (128.0, 4.0)])).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("additive") && text.contains("dot-product") && text.contains("time over length"));
}

#[test]
fn nothing_drawable_is_refused_and_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.png");
    // Zero and negative values cannot sit on a logarithmic axis; NaN never can.
    let err = draw_lines(&path, &chart(true, vec![(64.0, 0.0), (128.0, -1.0), (f64::NAN, 1.0)])).unwrap_err();
    assert!(err.to_string().contains("no series has a drawable point"), "{err}");
    assert!(!path.exists());
    let err = draw_lines(&dir.path().join("missing/c.png"), &chart(false, vec![(1.0, 1.0)])).unwrap_err();
    assert!(err.to_string().contains("cannot write"), "{err}");
}

#[test]
fn extension_decides_the_format_and_unknown_ones_are_refused_first() {
    let dir = tempfile::tempdir().unwrap();
    let jpeg = dir.path().join("c.jpeg");
    draw_lines(&jpeg, &chart(false, vec![(1.0, 1.0), (2.0, 3.0)])).unwrap();
    assert!(std::fs::read(&jpeg).unwrap().starts_with(b"\xff\xd8\xff"), "not a JPEG");
    // The extension is refused before the series are looked at (they have nothing drawable here).
    let tiff = dir.path().join("c.tiff");
    let err = draw_lines(&tiff, &chart(true, vec![(1.0, -1.0)])).unwrap_err().to_string();
    assert!(err.contains("c.tiff") && err.contains("'.tiff', expected .png, .svg, .jpg or .jpeg"), "{err}");
    assert!(!tiff.exists());
}

#[test]
fn log_log_slope_recovers_power_laws_and_skips_unplottable_points() {
    let law =
        |k: f64, c: f64| -> Vec<(f64, f64)> { [1e3f64, 2e3, 4e3, 8e3].iter().map(|&x| (x, c * x.powf(k))).collect() };
    for k in [1.0, 1.5, 2.0, -0.5] {
        let slope = log_log_slope(&law(k, 3e-7)).unwrap();
        assert!((slope - k).abs() < 1e-9, "{k}: {slope}");
    }
    // Noise around x²: the fit lies between the slopes of its segments.
    let noisy = [(1.0, 1.1), (2.0, 3.9), (4.0, 16.5), (8.0, 63.0)];
    let s = log_log_slope(&noisy).unwrap();
    assert!((1.9..2.1).contains(&s), "{s}");
    let mut with_bad = law(1.5, 1.0);
    with_bad.extend([(0.0, 1.0), (16e3, 0.0), (f64::NAN, 2.0), (32e3, f64::INFINITY)]);
    assert!((log_log_slope(&with_bad).unwrap() - 1.5).abs() < 1e-9);
    assert_eq!(log_log_slope(&[(2.0, 3.0)]), None);
    assert_eq!(log_log_slope(&[(2.0, 3.0), (2.0, 5.0)]), None);
    assert_eq!(log_log_slope(&[]), None);
}
