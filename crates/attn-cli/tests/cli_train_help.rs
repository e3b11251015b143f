//! What `--help` tells before a first run: `attn train --help` lists the dates task's fourteen
//! forms and says which slash form is month first; `attn translate --help` names the files
//! `--heatmap` writes; `--held-out` states its default.

use crate::train_common;

use attn_train::data::{Date, DateFormat};
use train_common::{attn, text};

#[test]
fn train_help_lists_the_fourteen_forms_and_the_held_out_default() {
    let o = attn(&["train", "--help"]);
    assert!(o.status.success());
    let help = text(&o.stdout);
    let date = Date::new(2021, 3, 14).unwrap();
    let forms: Vec<String> = DateFormat::ALL.iter().map(|f| f.render(date)).collect();
    assert_eq!(forms.len(), 14);
    for form in &forms {
        assert!(help.lines().any(|l| l.trim() == form), "{form:?} not listed: {help}");
    }
    assert!(help.contains("03/14/2021") && help.contains("NN/NN/YYYY is month first"), "{help}");
    assert!(help.contains("default: 5% of the data, at least 1, at most 1000"), "{help}");
}

#[test]
fn translate_help_names_the_heatmap_files() {
    let o = attn(&["translate", "--help"]);
    assert!(o.status.success());
    let help = text(&o.stdout);
    for file in ["a-layer1.png", "a-layer2.png", "a-average.png"] {
        assert!(help.contains(file), "{file} not in {help}");
    }
}
