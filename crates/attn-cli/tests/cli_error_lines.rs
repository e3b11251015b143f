//! Every error `attn` shows is one line whatever the environment: with `RUST_BACKTRACE` set, a
//! checkpoint whose weights do not fit its `config.json` is one line naming the file, not
//! candle's backtrace.

use crate::train_common;

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use train_common::{attn_with, one_line_error, text, train};

#[test]
fn weights_that_do_not_fit_are_one_line_under_rust_backtrace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let o = train(&dir, &["--steps", "5"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // One weight matrix loses a column; everything else, the file's metadata included, is kept.
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (_, metadata) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut tensors: Vec<(String, TensorView)> = file.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let (name, view) = tensors.iter_mut().find(|(_, v)| v.shape().len() == 2).unwrap();
    let (rows, cols) = (view.shape()[0], view.shape()[1] - 1);
    let cut: Vec<u8> = view.data()[..rows * cols * 4].to_vec();
    let cut_name = name.clone();
    let mut out: HashMap<String, TensorView> = tensors.into_iter().filter(|(n, _)| *n != cut_name).collect();
    out.insert(cut_name.clone(), TensorView::new(safetensors::Dtype::F32, vec![rows, cols], &cut).unwrap());
    std::fs::write(&path, safetensors::serialize(out, metadata.metadata().clone()).unwrap()).unwrap();

    for backtrace in ["1", "full"] {
        let o = attn_with(
            &["translate", "--checkpoint", dir.to_str().unwrap(), "3 March 2021"],
            &[("RUST_BACKTRACE", backtrace), ("RUST_LIB_BACKTRACE", backtrace)],
            b"",
        );
        one_line_error(&o, &["model.safetensors", &cut_name]);
    }
}

#[test]
fn an_edited_config_is_one_line_under_rust_backtrace() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    assert!(train(&dir, &["--steps", "5"]).status.success());
    let config = dir.join("config.json");
    let edited = std::fs::read_to_string(&config).unwrap().replace("\"d_model\": 16", "\"d_model\": 32");
    std::fs::write(&config, edited).unwrap();
    for backtrace in ["1", "full"] {
        let o = attn_with(
            &["translate", "--checkpoint", dir.to_str().unwrap(), "3 March 2021"],
            &[("RUST_BACKTRACE", backtrace)],
            b"",
        );
        one_line_error(&o, &["config.json", "d_model"]);
    }
}
