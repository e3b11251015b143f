//! Multi-head linear attention (Katharopoulos et al. 2020; Performer, Choromanski et al. 2021):
//! [`MultiHeadAttention`](crate::MultiHeadAttention)'s projections and weight names (so the same
//! state dict loads into either), with softmax replaced by a kernel feature map `φ`:
//! `out_proj(concat_h φ(q_h)ᵀ·Σ_j φ(k_hj) v_hjᵀ / (φ(q_h)ᵀ·Σ_j φ(k_hj) + ε))`, in time linear in
//! the sequence length ([`attn::linear_attention`], differentiable).
//!
//! `φ` ([`LinearMap`]) sees the projected queries and keys as they are for `elu(x)+1`, ReLU and
//! identity (no `1/√hd` scale, as Katharopoulos et al.); for FAVOR+ they are first scaled by
//! `hd^(-1/4)` each, so `φ(q)·φ(k)` estimates softmax's `exp(q·k/√hd)` (Performer's data
//! normaliser). FAVOR+'s projection is drawn once from the configured seed and the module's path,
//! so a model built again from the same configuration has the same features.
//!
//! Masks: key padding (boolean, at the end of each row) and causality; an attention mask is
//! refused (a linear kernel has no score matrix to mask). No weights are returned, for the same
//! reason. Decoding: a [`LinearCache`] holds the recurrent state (`S`, `z` per head), so each new
//! token costs `O(hd·F)` per head whatever the length decoded so far. With FAVOR+ the decoded rows
//! equal the causal forward's up to `ε`'s share of each denominator: the forward stabilises the
//! keys' features by their maximum over the whole sequence, decoding by the running maximum.

use attn::linear::{FavorFeatures, FeatureMap, LinearDecoder};
use attn::LinearOptions;
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use crate::dropout::SeedStream;
use crate::error::{NnError, Result};
use crate::layout::Layout;
use crate::masks::AttnMasks;
use crate::mha::proj::{check_heads, key_value, split_heads, ProjSizes, Projections};
use crate::mha::MhaOutput;

const MODULE: &str = "LinearAttention";

/// The feature map of [`LinearAttention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearMap {
    /// `elu(x) + 1` (Katharopoulos et al. 2020).
    Elu,
    /// `max(x, 0)`.
    Relu,
    /// `x` (denominators may vanish: use with care).
    Identity,
    /// FAVOR+ positive orthogonal random features, `features` of them per head.
    Favor {
        /// `m`, at least 1.
        features: usize,
    },
}

impl LinearMap {
    /// `elu`, `relu`, `identity` or `favor`.
    pub fn name(self) -> &'static str {
        match self {
            LinearMap::Elu => "elu",
            LinearMap::Relu => "relu",
            LinearMap::Identity => "identity",
            LinearMap::Favor { .. } => "favor",
        }
    }
}

/// Configuration of [`LinearAttention`].
#[derive(Debug, Clone)]
pub struct LinearAttentionConfig {
    /// `E`, the width of queries, keys, values and outputs.
    pub embed_dim: usize,
    /// Query heads `H`; must divide `E` (head width `hd = E / H`).
    pub num_heads: usize,
    /// Key/value heads `Hkv` (grouped-query); must divide `H`. `None` = `H`.
    pub num_kv_heads: Option<usize>,
    /// Whether the projections have biases.
    pub bias: bool,
    /// Inputs `[B, L, E]` (`true`) or `[L, B, E]`; unbatched `[L, E]` is taken either way.
    pub batch_first: bool,
    /// The feature map.
    pub map: LinearMap,
    /// Added to every denominator, finite and `> 0` (default [`attn::linear::EPS`]).
    pub eps: f64,
    /// Seed of FAVOR+'s projection (combined with the module's path).
    pub seed: u64,
}

impl LinearAttentionConfig {
    /// `embed_dim` split into `num_heads` heads with feature map `map`, biases, batch first.
    pub fn new(embed_dim: usize, num_heads: usize, map: LinearMap) -> Self {
        Self {
            embed_dim,
            num_heads,
            num_kv_heads: None,
            bias: true,
            batch_first: true,
            map,
            eps: attn::linear::EPS,
            seed: 0,
        }
    }

    fn kv_heads(&self) -> usize {
        self.num_kv_heads.unwrap_or(self.num_heads)
    }

    fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(NnError::Config { module: MODULE, field, reason });
        check_heads(MODULE, self.embed_dim, self.num_heads, self.kv_heads())?;
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", format!("{}, expected finite and > 0", self.eps));
        }
        if self.map == (LinearMap::Favor { features: 0 }) {
            return bad("map", "FAVOR+ with 0 features, expected at least 1".into());
        }
        Ok(())
    }
}

/// The recurrent state of one [`LinearAttention`] while decoding (empty until the first token).
#[derive(Debug, Clone, Default)]
pub struct LinearCache {
    state: Option<LinearDecoder>,
}

impl LinearCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens folded in so far.
    pub fn len(&self) -> usize {
        self.state.as_ref().map_or(0, LinearDecoder::len)
    }

    /// Whether nothing was folded in.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything (a new sequence).
    pub fn clear(&mut self) {
        self.state = None;
    }
}

/// The inputs of one call.
#[derive(Debug)]
pub struct LinearInput<'a> {
    /// `[B, Lq, E]` (`[Lq, B, E]` sequence first, `[Lq, E]` unbatched).
    pub query: &'a Tensor,
    /// `[B, Lk, E]` (laid out like `query`).
    pub key: &'a Tensor,
    /// `[B, Lk, E]` (laid out like `query`).
    pub value: &'a Tensor,
    /// Key padding and causality (`causal` needs `Lq = Lk`).
    pub masks: AttnMasks,
    /// Causal self-attention decoding: `query`, `key`, `value` hold the new positions only.
    pub cache: Option<&'a mut LinearCache>,
}

impl<'a> LinearInput<'a> {
    /// Attention of `query` over `key`/`value`, no masks.
    pub fn new(query: &'a Tensor, key: &'a Tensor, value: &'a Tensor) -> Self {
        Self { query, key, value, masks: AttnMasks::default(), cache: None }
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

    /// Decodes through `cache` (requires causal masks and no padding).
    pub fn cache(mut self, cache: &'a mut LinearCache) -> Self {
        self.cache = Some(cache);
        self
    }
}

/// Multi-head linear attention.
///
/// ```
/// use attn_nn::{AttnMasks, LinearAttention, LinearAttentionConfig, LinearCache, LinearInput, LinearMap};
/// # fn main() -> attn_nn::Result<()> {
/// let map = candle_nn::VarMap::new();
/// let cfg = LinearAttentionConfig::new(16, 4, LinearMap::Elu);
/// let m = LinearAttention::new(cfg, attn_nn::init::seeded(&map, 0))?;
/// let x = attn::random::uniform(&[2, 5, 16], -1.0, 1.0, 1)?; // [B, L, E]
/// let full = m.forward(LinearInput::self_attention(&x).masks(AttnMasks::causal()))?.out;
/// assert_eq!(full.dims(), [2, 5, 16]);
/// let mut cache = LinearCache::new(); // decoding: one token at a time
/// for i in 0..5 {
///     let step = x.narrow(1, i, 1)?;
///     let out = m.forward(LinearInput::self_attention(&step).masks(AttnMasks::causal()).cache(&mut cache))?.out;
///     let diff = (out - full.narrow(1, i, 1)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
///     assert!(diff < 1e-5);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LinearAttention {
    proj: Projections,
    /// `φ` with FAVOR+'s projection drawn.
    opts: LinearOptions,
    cfg: LinearAttentionConfig,
}

impl LinearAttention {
    /// Loads (or, from a `VarMap`, creates with PyTorch's initialisation) the weights under `vb`:
    /// those of a [`MultiHeadAttention`](crate::MultiHeadAttention) without `kdim`/`vdim`.
    pub fn new(cfg: LinearAttentionConfig, vb: VarBuilder) -> Result<Self> {
        cfg.check()?;
        let e = cfg.embed_dim;
        let hd = e / cfg.num_heads;
        let kv = cfg.kv_heads() * hd;
        let proj = Projections::load(ProjSizes { e, kv, kdim: e, vdim: e, bias: cfg.bias }, &vb)?;
        let map = match cfg.map {
            LinearMap::Elu => FeatureMap::Elu,
            LinearMap::Relu => FeatureMap::Relu,
            LinearMap::Identity => FeatureMap::Identity,
            LinearMap::Favor { features } => {
                let seed = SeedStream::new(cfg.seed, &vb.prefix()).key();
                FeatureMap::Favor(FavorFeatures::new(hd, features, seed).map_err(attn::AttnLibError::from)?)
            }
        };
        let opts = LinearOptions::new(map).eps(cfg.eps);
        Ok(Self { proj, opts, cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &LinearAttentionConfig {
        &self.cfg
    }

    /// `query: [B, Lq, E]`, `key`, `value: [B, Lk, E]` (or `[L, B, E]` with `batch_first` off, or
    /// unbatched `[L, E]`) → `out` laid out like `query`; `weights` is always `None`.
    pub fn forward(&self, input: LinearInput) -> Result<MhaOutput> {
        let cfg = &self.cfg;
        let (e, h, hkv) = (cfg.embed_dim, cfg.num_heads, cfg.kv_heads());
        let dtype = self.proj.out.weight().dtype();
        let layout = Layout::of(MODULE, "query", input.query, e, dtype, cfg.batch_first)?;
        let query = layout.to_bld(input.query)?;
        let (b, lq, _) = query.dims3()?;
        let (key, value) = key_value(MODULE, layout, (input.key, input.value), (e, e), dtype, b)?;
        let lk = key.dim(1)?;
        let scale = match cfg.map {
            LinearMap::Favor { .. } => ((e / h) as f64).powf(-0.25),
            _ => 1.0,
        };
        let project = |p: &crate::linear::Linear, x: &Tensor, n: usize, scale: f64| -> Result<Tensor> {
            let y = split_heads(&p.forward(x)?, n)?; // [B, n, L, hd]
            Ok(if scale == 1.0 { y } else { (y * scale)? })
        };
        let q = project(&self.proj.q, &query, h, scale)?;
        let k = project(&self.proj.k, &key, hkv, scale)?;
        let v = project(&self.proj.v, &value, hkv, 1.0)?;
        let out = match input.cache {
            None => {
                let mut opts = self.opts.clone().causal(input.masks.causal);
                opts.key_lengths = input.masks.key_lengths(MODULE, b, lk)?;
                attn::linear_attention(&q, &k, &v, &opts)?
            }
            Some(cache) => self.decode(cache, &input.masks, &q, &k, &v)?,
        }; // [B, H, Lq, hd]
        let out = out.to_dtype(dtype)?.transpose(1, 2)?.reshape((b, lq, e))?;
        Ok(MhaOutput { out: layout.restore(self.proj.out.forward(&out)?)?, weights: None })
    }

    /// The new positions `q: [B, H, Ln, hd]`, `k`, `v: [B, Hkv, Ln, hd]` one after another through
    /// the recurrent state → `[B, H, Ln, hd]`.
    fn decode(&self, cache: &mut LinearCache, masks: &AttnMasks, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (b, hkv, ln, hd) = k.dims4()?;
        if !masks.causal || masks.key_padding.is_some() || masks.attn.is_some() || q.dim(2)? != ln {
            return Err(NnError::Input {
                module: MODULE,
                input: "masks",
                found: q.dims().to_vec(),
                expected: "causal self-attention without padding or attention masks when decoding through a cache"
                    .into(),
            });
        }
        let dtype = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let state = match &mut cache.state {
            Some(s) => s,
            empty => empty.insert(LinearDecoder::new(&self.opts, dtype, b, hkv, hd, hd)?),
        };
        let rows = (0..ln)
            .map(|t| Ok(state.step(&q.narrow(2, t, 1)?, &k.narrow(2, t, 1)?, &v.narrow(2, t, 1)?)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&rows, 2)?)
    }
}
