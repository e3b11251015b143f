//! The README's library, sinks, packed-sequences and block-sparse examples are the texts the
//! crate's doctests compile (`doc/library-example.rs` and `doc/sparse-*.rs`, included in
//! `src/lib.rs`, `doc/sinks-example.rs`, on `SdpaOptions::sinks`, and `doc/varlen-example.rs`, in
//! `src/varlen/mod.rs`, `doc/linear-example.rs`, in `src/linear/mod.rs`, all with warnings denied): this checks README.md quotes them word for word,
//! so an edit to one without the other fails here.

const README: &str = include_str!("../../../README.md");
const EXAMPLE: &str = include_str!("../doc/library-example.rs");
const SINKS_EXAMPLE: &str = include_str!("../doc/sinks-example.rs");
const VARLEN_EXAMPLE: &str = include_str!("../doc/varlen-example.rs");
const LINEAR_EXAMPLE: &str = include_str!("../doc/linear-example.rs");
const SPARSE_EXAMPLES: [&str; 3] = [
    include_str!("../doc/sparse-mask-mod.rs"),
    include_str!("../doc/sparse-patterns.rs"),
    include_str!("../doc/sparse-score-mod.rs"),
];

/// The first rust block of README.md's section `heading`.
fn first_block(heading: &str) -> &'static str {
    let section = README.split_once(&format!("\n## {heading}\n")).expect("README has the section").1;
    let block = section.split_once("```rust\n").expect("the section has a rust block").1;
    &block[..block.find("```").expect("the rust block is closed")]
}

#[test]
fn readme_library_block_is_the_doctested_example() {
    assert_eq!(
        first_block("Library"),
        EXAMPLE,
        "README.md's Library block differs from crates/attn/doc/library-example.rs"
    );
}

#[test]
fn readme_sinks_block_is_the_doctested_example() {
    let block = first_block("Attention sinks");
    assert_eq!(block, SINKS_EXAMPLE, "README.md's Attention sinks block differs from crates/attn/doc/sinks-example.rs");
}

#[test]
fn readme_packed_sequences_block_is_the_doctested_example() {
    let block = first_block("Packed sequences");
    assert_eq!(
        block, VARLEN_EXAMPLE,
        "README.md's Packed sequences block differs from crates/attn/doc/varlen-example.rs"
    );
}

#[test]
fn readme_linear_attention_block_is_the_doctested_example() {
    let block = first_block("Linear attention");
    assert_eq!(
        block, LINEAR_EXAMPLE,
        "README.md's Linear attention block differs from crates/attn/doc/linear-example.rs"
    );
}

#[test]
fn readme_sparse_blocks_are_the_doctested_examples() {
    let section = README.split_once("\n## Sparse and programmable attention\n").expect("README has the section").1;
    let section = &section[..section.find("\n## ").expect("a section follows")];
    let blocks: Vec<&str> =
        section.split("```rust\n").skip(1).map(|b| &b[..b.find("```").expect("the rust block is closed")]).collect();
    assert_eq!(blocks, SPARSE_EXAMPLES, "README.md's sparse blocks differ from crates/attn/doc/sparse-*.rs");
}
