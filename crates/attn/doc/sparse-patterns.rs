use std::sync::Arc;

use attn::sparse::Pattern;
use attn::{sdpa, SdpaOptions, Window};

// The named patterns of the literature, for q, k, v: [1, 4, 512, 64] (self-attention, L = 512).
let window = Window { left: Some(64), right: Some(64) };
let patterns = [
    Pattern::Strided { stride: 23 },                             // Sparse Transformer, stride ≈ √L
    Pattern::Fixed { stride: 64, summary: 8 },                   // Sparse Transformer, fixed
    Pattern::Longformer { window, global: 16 },                  // window ∪ global rows and columns
    Pattern::BigBird { window, global: 16, random: 2, seed: 0 }, // ∪ 2 random key blocks per query block
    Pattern::Document { lengths: vec![100, 300, 112] },          // packed documents, causal in each
    Pattern::PrefixLm { prefix: 128 },                           // bidirectional prefix, then causal
    Pattern::Sinks { sinks: 4, window: 128 },                    // StreamingLLM: sinks ∪ last 128 keys
];
for pattern in patterns {
    let mask = Arc::new(pattern.block_mask(512, 512)?); // build once; share across calls and layers
    let out = sdpa(&q, &k, &v, &SdpaOptions::default().block_mask(mask))?;
    println!("{pattern}: {:?}", out.dims());
}
