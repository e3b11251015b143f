//! Padded and packed batches and the seeded order in which a run visits a dataset.
//!
//! Layout ([`Batch`]): the source is its characters then `eos`; the decoder input is `bos` then
//! the target; the decoder output (what the loss compares against) is the target then `eos`; each
//! is padded with `pad = 0` to the longest in the batch. The model's padding masks come from the
//! ids (`id == pad`), and the loss should ignore positions where `tgt_out` is `pad`.
//! [`PackedBatch`] holds the same sequences packed one after another ([`attn_nn::Packed`]), with
//! no padding to compute or ignore.
//!
//! Order ([`BatchOrder`]): epoch `e` is a permutation of the dataset drawn from `(seed, e)`, cut
//! into `⌈N / B⌉` batches (the last one smaller when `B` does not divide `N`); batch `k` of the
//! run is batch `k mod ⌈N / B⌉` of epoch `⌊k / ⌈N / B⌉⌋`, a pure function of `(seed, k)`, so a
//! run resumed at step `k` continues exactly.

use attn_nn::Packed;
use candle_core::{Device, Tensor};

use crate::data::error::DataError;
use crate::data::pairs::Pair;
use crate::data::sample::{shuffle_prefix, stream};
use crate::data::vocab::{Vocab, PAD};

const SALT_EPOCH: u64 = 0x4550_4F43_4853_4646;

/// A padded batch of `B` pairs; every tensor is `U32` token ids on the requested device.
///
/// ```
/// use attn_train::data::{vocab, Batch, Vocab};
/// let v = Vocab::from_texts(["abc", "xy"]);
/// let pairs = [("abc".to_string(), "x".to_string()), ("a".to_string(), "xy".to_string())];
/// let b = Batch::new(&pairs, &v, &candle_core::Device::Cpu)?;
/// assert_eq!(b.src.dims(), [2, 4]); // "abc" + eos
/// assert_eq!(b.tgt_in.to_vec2::<u32>()?[0], [vocab::BOS, v.id('x'), vocab::PAD]);
/// assert_eq!(b.tgt_out.to_vec2::<u32>()?[1], [v.id('x'), v.id('y'), vocab::EOS]);
/// assert_eq!((b.src_tokens, b.tgt_tokens), (6, 5));
/// # Ok::<(), attn_train::data::DataError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Batch {
    /// `[B, Ls]`: source characters then `eos`, right-padded with `pad`.
    pub src: Tensor,
    /// `[B, Lt]`: `bos` then target characters, right-padded with `pad`.
    pub tgt_in: Tensor,
    /// `[B, Lt]`: target characters then `eos`, right-padded with `pad`.
    pub tgt_out: Tensor,
    /// Non-padding ids in `src`.
    pub src_tokens: usize,
    /// Non-padding ids in `tgt_out` (the tokens the loss counts).
    pub tgt_tokens: usize,
}

impl Batch {
    /// The batch of `pairs`, encoded with `vocab` (characters outside it become `unk`); refused
    /// for no pairs.
    pub fn new(pairs: &[Pair], vocab: &Vocab, device: &Device) -> Result<Self, DataError> {
        let [src, tgt_in, tgt_out] = encode(pairs, vocab)?;
        Ok(Self {
            src_tokens: src.iter().map(Vec::len).sum(),
            tgt_tokens: tgt_out.iter().map(Vec::len).sum(),
            src: padded(&src, device)?,
            tgt_in: padded(&tgt_in, device)?,
            tgt_out: padded(&tgt_out, device)?,
        })
    }
}

/// A packed batch of `B` pairs: [`Batch`]'s sequences one after another, no padding; `U32` ids.
///
/// ```
/// use attn_train::data::{vocab, PackedBatch, Vocab};
/// let v = Vocab::from_texts(["abc", "xy"]);
/// let pairs = [("abc".to_string(), "x".to_string()), ("a".to_string(), "xy".to_string())];
/// let b = PackedBatch::new(&pairs, &v, &candle_core::Device::Cpu)?;
/// assert_eq!(b.src.cu_seqlens(), [0, 4, 6]); // "abc" + eos, "a" + eos
/// assert_eq!(b.tgt_in.data().to_vec1::<u32>()?[..2], [vocab::BOS, v.id('x')]);
/// assert_eq!(b.tgt_out.to_vec1::<u32>()?[..2], [v.id('x'), vocab::EOS]);
/// assert_eq!((b.src_tokens, b.tgt_tokens), (6, 5));
/// # Ok::<(), attn_train::TrainError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PackedBatch {
    /// `[total_s]`: each source's characters then `eos`.
    pub src: Packed,
    /// `[total_t]`: `bos` then each target's characters.
    pub tgt_in: Packed,
    /// `[total_t]`: each target's characters then `eos`, cut like `tgt_in`.
    pub tgt_out: Tensor,
    /// Ids in `src`.
    pub src_tokens: usize,
    /// Ids in `tgt_out` (the tokens the loss counts).
    pub tgt_tokens: usize,
}

impl PackedBatch {
    /// The batch of `pairs`, encoded with `vocab` as [`Batch::new`] does; refused for no pairs.
    pub fn new(pairs: &[Pair], vocab: &Vocab, device: &Device) -> crate::error::Result<Self> {
        let [src, tgt_in, tgt_out] = encode(pairs, vocab)?;
        let pack = |rows: &[Vec<u32>]| -> crate::error::Result<Packed> {
            let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
            let ids = Tensor::from_vec(rows.concat(), lengths.iter().sum::<usize>(), device)?;
            Ok(Packed::new(ids, attn::cu_seqlens(&lengths))?)
        };
        let (src, tgt_in) = (pack(&src)?, pack(&tgt_in)?);
        let tgt_out = Tensor::from_vec(tgt_out.concat(), tgt_in.total(), device)?;
        Ok(Self { src_tokens: src.total(), tgt_tokens: tgt_in.total(), src, tgt_in, tgt_out })
    }
}

/// The source, decoder-input and decoder-output ids of each pair; refused for no pairs.
fn encode(pairs: &[Pair], vocab: &Vocab) -> Result<[Vec<Vec<u32>>; 3], DataError> {
    if pairs.is_empty() {
        return Err(DataError::Argument {
            what: "Batch::new: pairs",
            expected: "at least one pair".into(),
            found: "none".into(),
        });
    }
    Ok([
        pairs.iter().map(|(s, _)| vocab.encode(s, false, true)).collect(),
        pairs.iter().map(|(_, t)| vocab.encode(t, true, false)).collect(),
        pairs.iter().map(|(_, t)| vocab.encode(t, false, true)).collect(),
    ])
}

/// `[B, L]` ids, each row right-padded with [`PAD`] to the longest row `L`.
fn padded(rows: &[Vec<u32>], device: &Device) -> Result<Tensor, DataError> {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut data = Vec::with_capacity(rows.len() * width);
    for row in rows {
        data.extend_from_slice(row);
        data.resize(data.len() + width - row.len(), PAD);
    }
    Ok(Tensor::from_vec(data, (rows.len(), width), device)?)
}

/// The seeded order of batches over a dataset of `N` items in batches of `B`.
///
/// ```
/// use attn_train::data::BatchOrder;
/// let order = BatchOrder::new(10, 4, 7)?;
/// assert_eq!(order.batches_per_epoch(), 3); // 4 + 4 + 2
/// let run: Vec<Vec<usize>> = order.iter_from(0).take(6).collect();
/// assert_eq!(run[4], order.batch(4)); // resuming at step 4 gives the same batch
/// # Ok::<(), attn_train::data::DataError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BatchOrder {
    len: usize,
    batch_size: usize,
    seed: u64,
}

impl BatchOrder {
    /// The order over `len` items in batches of `batch_size`; both must be positive.
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Result<Self, DataError> {
        for (what, value) in [("BatchOrder::new: len", len), ("BatchOrder::new: batch_size", batch_size)] {
            if value == 0 {
                return Err(DataError::Argument { what, expected: "a positive number".into(), found: "0".into() });
            }
        }
        Ok(Self { len, batch_size, seed })
    }

    /// Batches in one epoch, `⌈N / B⌉`.
    pub fn batches_per_epoch(&self) -> usize {
        self.len.div_ceil(self.batch_size)
    }

    /// The epoch of step `k`: `⌊k / ⌈N / B⌉⌋`.
    pub fn epoch_of(&self, step: u64) -> u64 {
        step / self.batches_per_epoch() as u64
    }

    /// Epoch `epoch`'s permutation of `0..N`.
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        shuffle_prefix(&mut stream(self.seed, SALT_EPOCH, epoch), &mut order, self.len);
        order
    }

    /// The item indices of batch `step` of the run (`B` of them, fewer for an epoch's last batch
    /// when `B` does not divide `N`).
    pub fn batch(&self, step: u64) -> Vec<usize> {
        self.slice(&self.permutation(self.epoch_of(step)), step).to_vec()
    }

    /// Batches `step, step + 1, …` without end; each epoch's permutation is drawn once.
    pub fn iter_from(&self, step: u64) -> impl Iterator<Item = Vec<usize>> + '_ {
        let mut epoch = self.epoch_of(step);
        let mut perm = self.permutation(epoch);
        (step..).map(move |k| {
            if self.epoch_of(k) != epoch {
                epoch = self.epoch_of(k);
                perm = self.permutation(epoch);
            }
            self.slice(&perm, k).to_vec()
        })
    }

    /// Step `k`'s part of its epoch's permutation.
    fn slice<'a>(&self, perm: &'a [usize], step: u64) -> &'a [usize] {
        let j = (step % self.batches_per_epoch() as u64) as usize;
        let start = j * self.batch_size;
        &perm[start..(start + self.batch_size).min(self.len)]
    }
}
