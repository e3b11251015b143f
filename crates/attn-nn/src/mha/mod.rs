//! Multi-head attention with PyTorch `nn.MultiheadAttention`'s semantics and weight names
//! (`add_bias_kv`, `add_zero_attn`, batch-first, sequence-first and unbatched inputs), extended
//! with grouped-query heads, rotary embeddings and a KV cache. Every call runs through
//! [`attn::sdpa_full`], the fused differentiable kernel; weights `[B, H, Lq, Lk]` are made only
//! when asked.
//!
//! Weights (PyTorch names): `in_proj_weight [3E, E]` when queries, keys and values all have
//! width `E` and every head has its own keys (`num_kv_heads == num_heads`); otherwise
//! `q_proj_weight [E, E]`, `k_proj_weight [Hkv·hd, kdim]`, `v_proj_weight [Hkv·hd, vdim]`; with
//! `bias`, `in_proj_bias [E + 2·Hkv·hd]`; `out_proj.weight [E, E]`, `out_proj.bias [E]`; with
//! `add_bias_kv`, `bias_k [1, 1, Hkv·hd]` and `bias_v [1, 1, Hkv·hd]`; with `sinks`, gpt-oss's
//! learned attention sinks `sinks [H]` (its name in gpt-oss's checkpoints too), one logit per
//! query head joining the softmax denominator of each of its rows (see [`SdpaOptions::sinks`]).
//!
//! `add_bias_kv` appends the learned key `bias_k` and value `bias_v` (projected space, not rotated
//! by RoPE) after the keys, `add_zero_attn` then a zero key and value; as in PyTorch every query
//! may attend these (PyTorch pads the masks with an unmasked column), causality included, and the
//! returned weights cover them (`Lk + 1` or `Lk + 2` columns). Through a KV cache they are
//! appended after the cached keys at every step, never stored.
//!
//! Packed batches (no padding): [`MultiHeadAttention::forward_packed`] and [`PackedMhaInput`].

mod packed;
pub(crate) mod proj;

pub use packed::PackedMhaInput;

use attn::{Kernel, Precision, SdpaOptions};
use candle_core::Tensor;
use candle_nn::{Init, VarBuilder};

use crate::dropout::{Mode, SeedStream};
use crate::error::{NnError, Result};
use crate::kv_cache::Cache;
use crate::layout::Layout;
use crate::masks::AttnMasks;
use crate::position::rope::RopeConfig;
use proj::{check_heads, key_value, split_heads, ProjSizes, Projections};

const MODULE: &str = "MultiHeadAttention";

/// Configuration of [`MultiHeadAttention`].
#[derive(Debug, Clone)]
pub struct MultiHeadAttentionConfig {
    /// `E`, the width of queries and outputs.
    pub embed_dim: usize,
    /// Query heads `H`; must divide `E` (head width `hd = E / H`).
    pub num_heads: usize,
    /// Key/value heads `Hkv` (grouped-query; 1 = multi-query); must divide `H`. `None` = `H`.
    pub num_kv_heads: Option<usize>,
    /// Width of keys (cross-attention from another model); `None` = `E`.
    pub kdim: Option<usize>,
    /// Width of values; `None` = `E`.
    pub vdim: Option<usize>,
    /// Whether the projections have biases (PyTorch's default: yes).
    pub bias: bool,
    /// PyTorch's `add_bias_kv`: learned `bias_k`, `bias_v` appended to the keys and values.
    pub add_bias_kv: bool,
    /// PyTorch's `add_zero_attn`: a zero key and value appended (after `bias_k`/`bias_v`).
    pub add_zero_attn: bool,
    /// Inputs `[B, L, E]` (`true`, this crate's default) or `[L, B, E]` (PyTorch's default,
    /// `batch_first=False`); unbatched `[L, E]` inputs are taken either way.
    pub batch_first: bool,
    /// Dropout on the attention weights in training, `0 <= p < 1`.
    pub dropout: f32,
    /// Rotary embeddings applied to queries and keys.
    pub rope: Option<RopeConfig>,
    /// gpt-oss's learned attention sinks: a parameter `sinks [H]` whose logit `sink_h` joins the
    /// softmax denominator of head `h`, `p_ij = exp(s_ij) / (Σ_k exp(s_ik) + exp(sink_h))`, so
    /// each row's weights sum to less than 1 (the missing share attends to nothing). Created as
    /// N(0, 0.02²), as Hugging Face's `GptOssAttention` initialises it.
    pub sinks: bool,
    /// The attention kernel (the fastest by default; `Kernel::Reference` for the plain one).
    pub kernel: Kernel,
    /// How the flash kernel computes its products (`Precision::Bf16` for a bf16 model on a CPU
    /// with AVX512-BF16; see `attn::SdpaOptions::compute`).
    pub compute: Precision,
    /// Seed of the dropout stream (combined with the module's path).
    pub seed: u64,
}

impl MultiHeadAttentionConfig {
    /// `embed_dim` split into `num_heads` heads, with biases, batch first, no dropout, no RoPE.
    pub fn new(embed_dim: usize, num_heads: usize) -> Self {
        Self {
            embed_dim,
            num_heads,
            num_kv_heads: None,
            kdim: None,
            vdim: None,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            batch_first: true,
            dropout: 0.0,
            rope: None,
            sinks: false,
            kernel: Kernel::Auto,
            compute: Precision::F32,
            seed: 0,
        }
    }

    fn kv_heads(&self) -> usize {
        self.num_kv_heads.unwrap_or(self.num_heads)
    }

    /// How many keys every call appends (`add_bias_kv`, `add_zero_attn`).
    fn extra_keys(&self) -> usize {
        usize::from(self.add_bias_kv) + usize::from(self.add_zero_attn)
    }

    fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(NnError::Config { module: MODULE, field, reason });
        check_heads(MODULE, self.embed_dim, self.num_heads, self.kv_heads())?;
        if !(0.0..1.0).contains(&self.dropout) {
            return bad("dropout", format!("{} is outside [0, 1)", self.dropout));
        }
        if self.rope.is_some() && !(self.embed_dim / self.num_heads).is_multiple_of(2) {
            return bad("rope", format!("head width {} is odd", self.embed_dim / self.num_heads));
        }
        Ok(())
    }
}

/// Which attention weights a call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeedWeights {
    /// `[B, H, Lq, Lk]`.
    PerHead,
    /// Averaged over heads, `[B, Lq, Lk]` (PyTorch's `average_attn_weights=True`).
    Averaged,
}

/// The inputs of one call.
#[derive(Debug)]
pub struct MhaInput<'a> {
    /// `[B, Lq, E]` (`[Lq, B, E]` sequence first, `[Lq, E]` unbatched).
    pub query: &'a Tensor,
    /// `[B, Lk, kdim]` (laid out like `query`).
    pub key: &'a Tensor,
    /// `[B, Lk, vdim]` (laid out like `query`).
    pub value: &'a Tensor,
    /// Padding, attention mask, causality.
    pub masks: AttnMasks,
    /// Whether and how to return the weights (computed only then).
    pub need_weights: Option<NeedWeights>,
    /// Evaluation or training (dropout on the weights).
    pub mode: Mode,
    /// Incremental decoding.
    pub cache: Option<Cache<'a>>,
}

impl<'a> MhaInput<'a> {
    /// Attention of `query` over `key`/`value`, no masks, evaluation mode.
    pub fn new(query: &'a Tensor, key: &'a Tensor, value: &'a Tensor) -> Self {
        Self { query, key, value, masks: AttnMasks::default(), need_weights: None, mode: Mode::Eval, cache: None }
    }

    /// Self-attention of `x: [B, L, E]`.
    pub fn self_attention(x: &'a Tensor) -> Self {
        Self::new(x, x, x)
    }

    /// Sets the masks.
    pub fn masks(mut self, masks: AttnMasks) -> Self {
        self.masks = masks;
        self
    }

    /// Asks for the weights.
    pub fn need_weights(mut self, which: NeedWeights) -> Self {
        self.need_weights = Some(which);
        self
    }

    /// Sets evaluation or training mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Decodes incrementally through `cache`.
    pub fn cache(mut self, cache: Cache<'a>) -> Self {
        self.cache = Some(cache);
        self
    }
}

/// What one call returns.
#[derive(Debug, Clone)]
pub struct MhaOutput {
    /// `[B, Lq, E]`, laid out like the query.
    pub out: Tensor,
    /// `[B, H, Lq, Lk]` or `[B, Lq, Lk]` when asked (without `B` when unbatched, batch first
    /// otherwise, as PyTorch; `Lk` counts the keys `add_bias_kv` and `add_zero_attn` append);
    /// softmax weights before dropout, differentiable (with sinks a row sums to
    /// less than 1).
    pub weights: Option<Tensor>,
}

/// Multi-head attention: `out_proj(concat_h softmax(q_h·k_hᵀ/√hd + masks)·v_h)`.
///
/// ```
/// use attn_nn::{AttnMasks, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig, NeedWeights};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// // 4 query heads sharing 2 key/value heads (grouped-query attention).
/// let cfg = MultiHeadAttentionConfig { num_kv_heads: Some(2), ..MultiHeadAttentionConfig::new(16, 4) };
/// let mha = MultiHeadAttention::new(cfg, attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[2, 5, 16], -1.0, 1.0, 1)?; // [B, L, E]
/// let tokens = candle_core::Tensor::new(&[[7u32, 8, 9, 0, 0], [4, 5, 6, 7, 8]], x.device())?;
/// let masks = AttnMasks::causal().key_padding(attn::padding_mask(&tokens, 0)?);
/// let o = mha.forward(MhaInput::self_attention(&x).masks(masks).need_weights(NeedWeights::Averaged))?;
/// assert_eq!(o.out.dims(), [2, 5, 16]);
/// assert_eq!(o.weights.unwrap().dims(), [2, 5, 5]); // [B, Lq, Lk], averaged over heads
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MultiHeadAttention {
    proj: Projections,
    /// `bias_k`, `bias_v`, each `[1, 1, Hkv·hd]`, with `add_bias_kv`.
    bias_kv: Option<(Tensor, Tensor)>,
    /// `sinks [H]`, with `sinks`.
    sinks: Option<Tensor>,
    cfg: MultiHeadAttentionConfig,
    seeds: SeedStream,
}

impl MultiHeadAttention {
    /// Loads (or, from a `VarMap`, creates with PyTorch's initialisation) the weights under `vb`.
    pub fn new(cfg: MultiHeadAttentionConfig, vb: VarBuilder) -> Result<Self> {
        cfg.check()?;
        let e = cfg.embed_dim;
        let kv = cfg.kv_heads() * (e / cfg.num_heads);
        let (kdim, vdim) = (cfg.kdim.unwrap_or(e), cfg.vdim.unwrap_or(e));
        let proj = Projections::load(ProjSizes { e, kv, kdim, vdim, bias: cfg.bias }, &vb)?;
        // PyTorch: xavier_normal_ on [1, 1, kv], whose fans are both kv.
        let bias_kv_init = Init::Randn { mean: 0.0, stdev: (kv as f64).powf(-0.5) };
        let bias_kv = if cfg.add_bias_kv {
            Some((
                vb.get_with_hints((1, 1, kv), "bias_k", bias_kv_init)?,
                vb.get_with_hints((1, 1, kv), "bias_v", bias_kv_init)?,
            ))
        } else {
            None
        };
        let sinks_init = Init::Randn { mean: 0.0, stdev: 0.02 };
        let sinks = if cfg.sinks { Some(vb.get_with_hints(cfg.num_heads, "sinks", sinks_init)?) } else { None };
        let seeds = SeedStream::new(cfg.seed, &vb.prefix());
        Ok(Self { proj, bias_kv, sinks, cfg, seeds })
    }

    /// The configuration.
    pub fn config(&self) -> &MultiHeadAttentionConfig {
        &self.cfg
    }

    /// `query: [B, Lq, E]`, `key: [B, Lk, kdim]`, `value: [B, Lk, vdim]` (or `[L, B, ..]` with
    /// `batch_first` off, or unbatched `[L, ..]`) → `out` laid out like `query`, weights
    /// `[B, H, Lq, Lk]` / `[B, Lq, Lk]` when asked. With a self-attention cache `Lk` counts the
    /// cached positions too.
    pub fn forward(&self, input: MhaInput) -> Result<MhaOutput> {
        let cfg = &self.cfg;
        let (e, h, hkv) = (cfg.embed_dim, cfg.num_heads, cfg.kv_heads());
        let dtype = self.proj.out.weight().dtype();
        let layout = Layout::of(MODULE, "query", input.query, e, dtype, cfg.batch_first)?;
        let query = layout.to_bld(input.query)?;
        let (b, lq, _) = query.dims3()?;
        let fresh_kv = |offset: usize| -> Result<(Tensor, Tensor)> {
            let widths = (cfg.kdim.unwrap_or(e), cfg.vdim.unwrap_or(e));
            let (key, value) = key_value(MODULE, layout, (input.key, input.value), widths, dtype, b)?;
            let k = split_heads(&self.proj.k.forward(&key)?, hkv)?; // [B, Hkv, Lk, hd]
            let v = split_heads(&self.proj.v.forward(&value)?, hkv)?; // [B, Hkv, Lk, hd]
            Ok((self.rotate(&k, offset)?, v))
        };
        let (offset, (k, v)) = match input.cache {
            None => (0, fresh_kv(0)?),
            Some(Cache::SelfAttn(cache)) => {
                let offset = cache.len();
                let (k, v) = fresh_kv(offset)?;
                (offset, cache.append(k, v)?)
            }
            Some(Cache::Cross(cache)) => match cache.get() {
                Some(kv) => (0, kv.clone()),
                None => {
                    let (k, v) = fresh_kv(0)?;
                    (0, cache.append(k, v)?)
                }
            },
        };
        let q = self.rotate(&split_heads(&self.proj.q.forward(&query)?, h)?, offset)?; // [B, H, Lq, hd]
        let lk = k.dims()[2];
        let (k, v) = self.append_extra_keys(k, v)?; // [B, Hkv, Lk + extra, hd]
        let mut opts =
            SdpaOptions::default().kernel(cfg.kernel).compute(cfg.compute).return_weights(input.need_weights.is_some());
        opts.sinks = self.sinks.clone();
        if cfg.dropout > 0.0 {
            if let Some(seed) = self.seeds.seed(input.mode) {
                opts = opts.dropout(cfg.dropout, seed);
            }
        }
        let opts = input.masks.options(MODULE, opts, [b, h, lq, lk], offset > 0, cfg.extra_keys())?;
        let res = attn::sdpa_full(&q, &k, &v, &opts)?;
        let out = res.out.transpose(1, 2)?.reshape((b, lq, e))?; // [B, Lq, E]
        let weights = match (input.need_weights, res.weights) {
            (Some(NeedWeights::Averaged), Some(w)) => Some(w.mean(1)?),
            (_, w) => w,
        };
        Ok(MhaOutput { out: layout.restore(self.proj.out.forward(&out)?)?, weights: layout.weights(weights)? })
    }

    /// `k`, `v: [B, Hkv, Lk, hd]` followed by `bias_k`/`bias_v` (`add_bias_kv`) and a zero key and
    /// value (`add_zero_attn`).
    fn append_extra_keys(&self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let (b, hkv, _, hd) = k.dims4()?;
        let (mut ks, mut vs) = (vec![k], vec![v]);
        if let Some((bias_k, bias_v)) = &self.bias_kv {
            let row = |t: &Tensor| -> Result<Tensor> { Ok(t.reshape((1, hkv, 1, hd))?.broadcast_as((b, hkv, 1, hd))?) };
            ks.push(row(bias_k)?);
            vs.push(row(bias_v)?);
        }
        if self.cfg.add_zero_attn {
            let zeros = Tensor::zeros((b, hkv, 1, hd), ks[0].dtype(), ks[0].device())?;
            ks.push(zeros.clone());
            vs.push(zeros);
        }
        if ks.len() == 1 {
            return Ok((ks.remove(0), vs.remove(0)));
        }
        Ok((Tensor::cat(&ks, 2)?, Tensor::cat(&vs, 2)?))
    }

    /// RoPE on `x: [B, n, L, hd]` at positions from `offset`, when configured.
    fn rotate(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        match &self.cfg.rope {
            Some(rope) => rope.apply(x, offset),
            None => Ok(x.clone()),
        }
    }
}
