use attn::{cu_seqlens, sdpa_varlen_full, SdpaOptions};

// Three sequences of 5, 2 and 9 tokens packed without padding: q, k, v are [16, H, D].
let cu = cu_seqlens(&[5, 2, 9]);                                  // [0, 5, 7, 16]
let opts = SdpaOptions::default().causal(true);                   // causal within each sequence
let r = sdpa_varlen_full(&q, &k, &v, &cu, &cu, &opts)?;           // out [16, H, Dv], lse [H, 16]
let grads = (r.out * &target)?.sum_all()?.backward()?;            // dq, dk, dv in packed shapes
