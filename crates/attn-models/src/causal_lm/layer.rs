//! One decoder layer: pre-norm grouped-query attention with RoPE against each sequence's KV
//! cache (Gemma 3: QK-norm and sandwich norms), then the gated feed-forward (SwiGLU or GeGLU).

use attn::cache::{PagedCache, PagedParams, SeqId};
use attn::{Align, SdpaOptions, Window};
use attn_nn::{Linear, RmsNorm, RopeConfig};
use candle_core::Tensor;
use candle_nn::VarBuilder;

use super::config::{CausalLmConfig, Family, LayerAttention};
use crate::error::Result;
use crate::kv_buffer::KvBuffer;

/// One layer's cache of one sequence: dense buffers (attended by `attn::sdpa`) or a paged cache
/// holding the sequence (attended by the paged kernel).
#[derive(Debug, Clone)]
pub(super) enum LayerCache {
    Dense(KvBuffer),
    Paged(Box<PagedCache>, SeqId),
}

impl LayerCache {
    pub(super) fn len(&self) -> usize {
        match self {
            LayerCache::Dense(b) => b.len(),
            LayerCache::Paged(p, s) => p.len(*s).expect("the cache holds its own sequence"),
        }
    }
}

/// Gemma 3's extra norms.
#[derive(Debug)]
struct GemmaNorms {
    q: RmsNorm,
    k: RmsNorm,
    post_attention: RmsNorm,
    post_ffw: RmsNorm,
}

#[derive(Debug)]
pub(super) struct Layer {
    attention: LayerAttention,
    attn_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    gemma: Option<GemmaNorms>,
}

impl Layer {
    pub(super) fn new(cfg: &CausalLmConfig, attention: LayerAttention, vb: VarBuilder) -> Result<Self> {
        let e = cfg.hidden_size;
        let (q, kv, f) = (cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size);
        // Qwen2's q/k/v projections have biases; a bias the file holds is loaded.
        let w = |name: &str, rows, cols| {
            let load = if vb.contains_tensor(&format!("{name}.bias")) { Linear::load } else { Linear::load_no_bias };
            load(cols, rows, vb.pp(name))
        };
        let norm = |name: &str, dim| RmsNorm::new(dim, cfg.rms_eps, vb.pp(name));
        let gemma = match cfg.family {
            Family::Llama => None,
            Family::Gemma3 => Some(GemmaNorms {
                q: norm("attn_q_norm", cfg.head_dim)?,
                k: norm("attn_k_norm", cfg.head_dim)?,
                post_attention: norm("post_attention_norm", e)?,
                post_ffw: norm("post_ffw_norm", e)?,
            }),
        };
        Ok(Self {
            attention,
            attn_norm: norm("attn_norm", e)?,
            q: w("attn_q", q, e)?,
            k: w("attn_k", kv, e)?,
            v: w("attn_v", kv, e)?,
            o: w("attn_output", e, q)?,
            ffn_norm: norm("ffn_norm", e)?,
            gate: w("ffn_gate", f, e)?,
            up: w("ffn_up", f, e)?,
            down: w("ffn_down", e, f)?,
            gemma,
        })
    }

    /// The linear layers: projections and feed-forward.
    pub(super) fn linears_mut(&mut self) -> [&mut Linear; 7] {
        [&mut self.q, &mut self.k, &mut self.v, &mut self.o, &mut self.gate, &mut self.up, &mut self.down]
    }

    /// `x: [B, L, E]`, row `b` at positions `caches[b].len()..` → `[B, L, E]`, each cache grown by
    /// `L`; the attention weights `[1, Hq, L, Lcache + L]` of each row pushed to `weights` when
    /// given. The projections and the feed-forward run on the whole batch, RoPE and attention per
    /// row against its own cache (rows of a batch have caches of different lengths).
    pub(super) fn forward(
        &self,
        x: &Tensor,
        cfg: &CausalLmConfig,
        caches: &mut [&mut LayerCache],
        mut weights: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let (b, l, _) = x.dims3()?;
        let rope = RopeConfig { base: self.attention.rope_base };
        let h = self.attn_norm.forward(x)?;
        let heads =
            |t: Tensor, n: usize| -> Result<Tensor> { Ok(t.reshape((b, l, n, cfg.head_dim))?.transpose(1, 2)?) };
        let mut q = heads(self.q.forward(&h)?, cfg.num_heads)?;
        let mut k = heads(self.k.forward(&h)?, cfg.num_kv_heads)?;
        if let Some(g) = &self.gemma {
            q = g.q.forward(&q)?;
            k = g.k.forward(&k)?;
        }
        let v = heads(self.v.forward(&h)?, cfg.num_kv_heads)?;
        let scale = 1.0 / (cfg.head_dim as f64).sqrt();
        let mut opts = SdpaOptions::default()
            .causal(true)
            .align(Align::BottomRight)
            .scale(scale)
            .return_weights(weights.is_some());
        let window = self.attention.window.map(|w| Window { left: Some(w.saturating_sub(1)), right: Some(0) });
        if let Some(w) = window {
            opts = opts.window(w.left, w.right);
        }
        let paged = PagedParams { scale: Some(scale), causal: true, window, ..Default::default() };
        let mut rows = Vec::with_capacity(b);
        for (i, cache) in caches.iter_mut().enumerate() {
            let offset = cache.len();
            let (qi, ki) = rope.apply_pair(&q.narrow(0, i, 1)?, &k.narrow(0, i, 1)?, offset)?;
            let vi = v.narrow(0, i, 1)?;
            match cache {
                LayerCache::Dense(buf) => {
                    let (ck, cv) = buf.append(&ki, &vi)?;
                    let out = attn::sdpa_full(&qi, &ck, &cv, &opts)?;
                    if let (Some(sink), Some(w)) = (weights.as_deref_mut(), out.weights) {
                        sink.push(w);
                    }
                    rows.push(out.out);
                }
                LayerCache::Paged(pages, seq) => {
                    // The pages hold positions `[n, Hkv, D]`.
                    let tokens = |t: &Tensor| -> Result<Tensor> { Ok(t.squeeze(0)?.transpose(0, 1)?) };
                    pages.append(*seq, &tokens(&ki)?, &tokens(&vi)?)?;
                    rows.push(pages.attend(&qi, &[*seq], &paged)?.0);
                }
            }
        }
        let out = if rows.len() == 1 { rows.remove(0) } else { Tensor::cat(&rows, 0)? };
        let mut a = self.o.forward(&out.transpose(1, 2)?.reshape((b, l, cfg.num_heads * cfg.head_dim))?)?;
        if let Some(g) = &self.gemma {
            a = g.post_attention.forward(&a)?;
        }
        let x = (a + x)?;
        let h = self.ffn_norm.forward(&x)?;
        let gate = self.gate.forward(&h)?;
        let act = match cfg.family {
            Family::Llama => candle_nn::ops::silu(&gate)?,
            Family::Gemma3 => attn_nn::fused::gelu(&gate, attn_nn::fused::Approximate::Tanh)?,
        };
        let mut f = self.down.forward(&(act * self.up.forward(&h)?)?)?;
        if let Some(g) = &self.gemma {
            f = g.post_ffw.forward(&f)?;
        }
        Ok((f + x)?)
    }
}
