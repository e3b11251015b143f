use attn::{padding_mask, sdpa_full, SdpaOptions};

let out = attn::sdpa(&q, &k, &v, &SdpaOptions::default().causal(true))?;          // [B, H, Lq, Dv]
let mask = padding_mask(&token_ids, 0)?;                                          // keep [B, 1, 1, L]
let full = sdpa_full(&q, &k, &v, &SdpaOptions::default().mask(mask).return_weights(true))?;
let (o, lse, w) = (full.out, full.lse, full.weights.unwrap());
