//! The README's library example and its block-sparse examples are the texts the crate's doctests
//! compile (`doc/library-example.rs`, `doc/sparse-mask-mod.rs`, `doc/sparse-patterns.rs`, included
//! in `src/lib.rs` with warnings denied): this checks README.md quotes them word for word, so an
//! edit to one without the other fails here.

const README: &str = include_str!("../../../README.md");
const EXAMPLE: &str = include_str!("../doc/library-example.rs");
const SPARSE_EXAMPLES: [&str; 2] =
    [include_str!("../doc/sparse-mask-mod.rs"), include_str!("../doc/sparse-patterns.rs")];

#[test]
fn readme_library_block_is_the_doctested_example() {
    let section = README.split_once("\n## Library\n").expect("README has a '## Library' section").1;
    let block = section.split_once("```rust\n").expect("the Library section has a rust block").1;
    let block = &block[..block.find("```").expect("the rust block is closed")];
    assert_eq!(block, EXAMPLE, "README.md's Library block differs from crates/attn/doc/library-example.rs");
}

#[test]
fn readme_sparse_blocks_are_the_doctested_examples() {
    let section = README.split_once("\n## Sparse and programmable attention\n").expect("README has the section").1;
    let section = &section[..section.find("\n## ").expect("a section follows")];
    let blocks: Vec<&str> =
        section.split("```rust\n").skip(1).map(|b| &b[..b.find("```").expect("the rust block is closed")]).collect();
    assert_eq!(blocks, SPARSE_EXAMPLES, "README.md's sparse blocks differ from crates/attn/doc/sparse-*.rs");
}
