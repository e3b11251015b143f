use attn::linear::{linear_attention, FeatureMap, LinearOptions};

// Causal linear attention with elu(x)+1 features: O(L) time, gradients through candle's autograd.
let opts = LinearOptions::new(FeatureMap::Elu).causal(true);
let out = linear_attention(&q, &k, &v, &opts)?;                   // [1, 4, 1024, 64]
let grads = (&out * &target)?.sum_all()?.backward()?;             // dq, dk, dv

// FAVOR+ (Performer), 256 seeded random features: estimates softmax(q·kᵀ), unscaled.
let favor = LinearOptions::favor(64, 256, 7)?;
let approx = linear_attention(&q, &k, &v, &favor)?;
