//! What identifies a run, recorded in the metadata of `model.safetensors` at every save and
//! checked whenever a checkpoint is loaded: the model's sizes, the training settings but the total
//! of steps, the task, the SHA-256 of the pairs file's contents and of the vocabulary. So a
//! `config.json` edited after the save (say `heads`, which changes no weight's shape) or another
//! `vocab.json` is refused, naming what differs, and a resumed run can tell that its data changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::checkpoint::Manifest;
use crate::data::Vocab;

/// The prefix of the record's keys among the metadata of `model.safetensors`.
const PREFIX: &str = "attn.";

/// `sha256:` and the hexadecimal SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// The record of the run `manifest` describes, trained with `vocab`: `model.<field>` and
/// `train.<field>` (JSON values; not `train.steps`, which a resumed run may raise, nor the data's
/// path, which may move), `data` ([`Manifest::data`]) and `vocab` (the SHA-256 of its JSON).
pub fn record(manifest: &Manifest, vocab: &Vocab) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    flatten(&mut out, "model", &manifest.model, &[]);
    flatten(&mut out, "train", &manifest.train, &["steps", "task"]);
    out.insert("data".into(), manifest.data.clone());
    out.insert("vocab".into(), sha256(vocab.to_json().as_bytes()));
    out
}

/// Adds each field of `value` (a struct) as `group.field` → its JSON, except those in `skip`.
fn flatten(out: &mut BTreeMap<String, String>, group: &str, value: &impl Serialize, skip: &[&str]) {
    let value = serde_json::to_value(value).expect("settings serialise");
    for (field, v) in value.as_object().expect("settings are a struct") {
        if !skip.contains(&field.as_str()) {
            out.insert(format!("{group}.{field}"), v.to_string());
        }
    }
}

/// `record` as the metadata stored in `model.safetensors`.
pub fn to_metadata(record: &BTreeMap<String, String>) -> HashMap<String, String> {
    record.iter().map(|(k, v)| (format!("{PREFIX}{k}"), v.clone())).collect()
}

/// How the checkpoint as it reads now (`now`, from its `config.json` and `vocab.json`) differs from
/// the record saved with its weights, one phrase per difference naming the file; empty when they
/// agree. `saved` is the metadata of `model.safetensors`.
pub fn differences(saved: &HashMap<String, String>, now: &BTreeMap<String, String>) -> Vec<String> {
    let saved: BTreeMap<&str, &str> =
        saved.iter().filter_map(|(k, v)| Some((k.strip_prefix(PREFIX)?, v.as_str()))).collect();
    let keys: BTreeSet<&str> = saved.keys().copied().chain(now.keys().map(String::as_str)).collect();
    let mut out = Vec::new();
    for key in keys {
        let (was, is) = (saved.get(key).copied(), now.get(key).map(String::as_str));
        if was == is {
            continue;
        }
        out.push(match (key, was, is) {
            ("vocab", _, _) => "vocab.json is not the vocabulary the weights were saved with".to_string(),
            (_, Some(was), Some(is)) => format!("config.json has {key} {is}, the weights were saved with {was}"),
            (_, None, Some(is)) => format!("config.json has {key} {is}, which the weights' record lacks"),
            (_, was, None) => {
                format!("config.json lacks {key}, which the weights were saved with ({})", was.unwrap_or_default())
            }
        });
    }
    out
}
