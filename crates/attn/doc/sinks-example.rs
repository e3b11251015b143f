use attn::{sdpa_full, SdpaOptions};
use candle_core::{Device, Tensor, Var};

// One learned logit per query head (q: [B, 4, L, D]); -inf = no sink for that head.
let sinks = Var::from_tensor(&Tensor::new(&[0.5f32, -1.0, 2.0, f32::NEG_INFINITY], &Device::Cpu)?)?;
let opts = SdpaOptions::default().causal(true).sinks(sinks.as_tensor().clone()).return_weights(true);
let full = sdpa_full(&q, &k, &v, &opts)?;
let (w, lse) = (full.weights.unwrap(), full.lse);        // rows of w sum to 1 − exp(sink − lse)
let grads = full.out.sum_all()?.backward()?;
let dsinks = grads.get(&sinks).unwrap();                 // [4], 0 for the −∞ head
