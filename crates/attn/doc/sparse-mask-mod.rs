use std::sync::Arc;

use attn::sparse::{BlockMask, BlockShape};
use attn::{sdpa, SdpaOptions};

// Any mask as a Rust predicate (b, h, query, key) -> keep: here each query sees the keys of its
// own 128-token segment and the first 16 tokens. q, k, v: [1, 4, 512, 64].
let keep = |_b: usize, _h: usize, q: usize, kv: usize| kv / 128 == q / 128 || kv < 16;
let shape = BlockShape { batch: 1, heads: 1, lq: 512, lk: 512 }; // 1: the same for every entry and head
let mask = Arc::new(BlockMask::build(shape, Arc::new(keep))?); // 64×64 blocks: full, partial or skipped
println!("{:.0}% of blocks computed, {} bytes", 100.0 * mask.density(), mask.bytes());
let out = sdpa(&q, &k, &v, &SdpaOptions::default().block_mask(mask.clone()))?; // [1, 4, 512, 64]
