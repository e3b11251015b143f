use std::sync::Arc;

use attn::score_mod::{Alibi, RelativeBias};
use attn::{sdpa, Align, SdpaOptions};
use candle_core::Var;

// Scores modified before the softmax, differentiably. q, k, v: [1, 4, 512, 64].
// ALiBi: s − m_h·|i − j|, the paper's slopes, no table.
let alibi = Arc::new(Alibi::new(4, 512, 512, Align::TopLeft));
let out = sdpa(&q, &k, &v, &SdpaOptions::default().causal(true).score_mod(alibi, None))?;
// T5's relative-position bias: s + table[h, bucket(j − i)], the table [4, 32] trained.
let t5 = RelativeBias { heads: 4, buckets: 32, max_distance: 128, bidirectional: true };
let table = Var::zeros((4, 32), candle_core::DType::F32, q.device())?;
let opts = SdpaOptions::default().score_mod(Arc::new(t5), Some(table.as_tensor().clone()));
let grads = sdpa(&q, &k, &v, &opts)?.sqr()?.sum_all()?.backward()?;
let dtable = grads.get(table.as_tensor()); // the table's gradient, [4, 32]
