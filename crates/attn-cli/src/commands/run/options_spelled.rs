//! Every option of a call (`attn::SdpaOptions`'s fields) against its spelling on the command line
//! (`attn run`'s flags) and in Python (`attn.sdpa`'s keywords, `python/attn/__init__.py`), each
//! difference said why. A new library option fails here until it is given a flag and a keyword or
//! a reason; a flag or keyword named here that does not exist fails too.

use super::Args;

/// A spelling, or the reason there is none.
type Spelling = Result<&'static str, &'static str>;

/// `(option, flag of attn run, Python keyword)`.
const SPELLED: [(&str, Spelling, Spelling); 15] = [
    ("scale", Ok("scale"), Ok("scale")),
    ("causal", Ok("causal"), Ok("is_causal")),
    ("align", Ok("align"), Ok("align")),
    ("window", Ok("window"), Ok("window")),
    ("mask", Ok("mask"), Ok("attn_mask")),
    // PyTorch's one `attn_mask` is a keep-mask when boolean and a bias when float.
    ("bias", Ok("bias"), Ok("attn_mask")),
    ("key_lengths", Ok("key-lengths"), Ok("key_lengths")),
    (
        "block_mask",
        Ok("pattern"),
        Err("a Rust value (a named pattern's or a mask_mod closure's block mask); Python hands none"),
    ),
    ("softcap", Ok("softcap"), Ok("softcap")),
    // The dropout's seed is its own flag and keyword (`--seed`, `seed`).
    ("dropout", Ok("dropout"), Ok("dropout_p")),
    ("sinks", Ok("sinks"), Ok("sinks")),
    (
        "score_mod",
        Err("a Rust trait object; the CLI's --softcap is the built-in one"),
        Err("a Rust trait object; Python hands none"),
    ),
    ("kernel", Ok("kernel"), Err("Python always runs Kernel::Auto, the fastest kernel this CPU has")),
    ("compute", Ok("compute"), Ok("compute")),
    ("return_weights", Ok("weights"), Ok("return_weights")),
];

/// Python keywords with no option of their own: `enable_gqa` (grouped heads are read from the
/// shapes), `return_lse` (the library always returns the log-sum-exp), `seed` (dropout's).
const PYTHON_ONLY: [&str; 3] = ["enable_gqa", "return_lse", "seed"];

/// The field names of a `Debug`-printed struct, `Name { a: .., b: .. }`, at its top level.
fn fields(debug: &str) -> Vec<String> {
    let body = &debug[debug.find('{').expect("a struct") + 1..debug.rfind('}').expect("a struct")];
    let (mut depth, mut start, mut names) = (0i32, 0, Vec::new());
    for (i, c) in body.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => start = i + 1,
            ':' if depth == 0 && body[start..i].trim().chars().all(|c| c.is_alphanumeric() || c == '_') => {
                names.push(body[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    names
}

/// The parameter names of `def sdpa(...)` in `python/attn/__init__.py`.
fn python_keywords() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../python/attn/__init__.py");
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let sig = &src[src.find("def sdpa(").expect("def sdpa(") + 9..];
    let sig = &sig[..sig.find("):").expect("the end of sdpa's parameters")];
    sig.split(',')
        .map(|p| p.split('=').next().unwrap_or_default().trim().to_string())
        .filter(|p| !p.is_empty() && p != "*")
        .collect()
}

#[test]
fn every_option_has_a_flag_and_a_keyword_or_a_reason() {
    let options = fields(&format!("{:?}", attn::SdpaOptions::default()));
    let listed: Vec<&str> = SPELLED.iter().map(|(o, ..)| *o).collect();
    assert_eq!(options, listed, "SdpaOptions' fields against the table (in order)");

    let cmd = <Args as clap::Args>::augment_args(clap::Command::new("run"));
    let flags: Vec<&str> = cmd.get_arguments().filter_map(|a| a.get_long()).collect();
    let keywords = python_keywords();
    for (option, flag, keyword) in SPELLED {
        if let Ok(flag) = flag {
            assert!(flags.contains(&flag), "{option}: attn run has no --{flag} (flags: {flags:?})");
        }
        if let Ok(keyword) = keyword {
            assert!(keywords.iter().any(|k| k == keyword), "{option}: attn.sdpa has no {keyword} ({keywords:?})");
        }
    }
    let tensors = ["query", "key", "value"];
    for k in &keywords {
        let named = SPELLED.iter().any(|(_, _, p)| *p == Ok(k.as_str()));
        assert!(
            named || PYTHON_ONLY.contains(&k.as_str()) || tensors.contains(&k.as_str()),
            "attn.sdpa's {k} is neither an option nor a documented Python-only keyword"
        );
    }
}

#[test]
fn the_field_reader_reads_nested_values() {
    assert_eq!(fields("S { a: Some(T { x: 1, y: [2, 3] }), b_c: \"k: v\", d: None }"), ["a", "b_c", "d"]);
}
