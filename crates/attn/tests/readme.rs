//! The README's library example is the text the crate's doctest compiles (`doc/library-example.rs`,
//! included in `src/lib.rs` with warnings denied): this checks README.md quotes it word for word,
//! so an edit to one without the other fails here.

const README: &str = include_str!("../../../README.md");
const EXAMPLE: &str = include_str!("../doc/library-example.rs");

#[test]
fn readme_library_block_is_the_doctested_example() {
    let section = README.split_once("\n## Library\n").expect("README has a '## Library' section").1;
    let block = section.split_once("```rust\n").expect("the Library section has a rust block").1;
    let block = &block[..block.find("```").expect("the rust block is closed")];
    assert_eq!(block, EXAMPLE, "README.md's Library block differs from crates/attn/doc/library-example.rs");
}
