//! Intel AMX tiles for the bfloat16 products ([`crate::Precision::Bf16`]): the tile operations
//! the forward's products need ([`Tiles`]: zero, load, store and `TDPBF16PS`), run by the CPU
//! ([`Hardware`], inline assembly) or by a software model of the same instructions ([`Emulated`],
//! any CPU), so that the code around the tiles — layouts, strides, padding, the blocking — is
//! tested everywhere. [`status`] is the one run-time check of whether the hardware path may run:
//! the CPU reports AMX-TILE and AMX-BF16, Linux grants the process the tile data state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`; a refusal falls back), and a self-test product computed by
//! the tiles equals the model's to the bit. Every tile here is configured alike: 16 rows of 64
//! bytes (16 f32, or 16 bfloat16 pairs), palette 1.

mod emulated;
mod hardware;

pub use emulated::Emulated;
pub use hardware::{Configured, Hardware};

use std::sync::OnceLock;

/// Rows of every tile.
pub const TILE_ROWS: usize = 16;
/// 32-bit slots per tile row: 16 f32, or 16 bfloat16 pairs.
pub const TILE_SLOTS: usize = 16;

/// The tile operations of the products, on tile registers `0..8` named by const parameters (the
/// hardware's registers are named in the instruction). Tile rows are `TILE_SLOTS` 32-bit slots.
pub trait Tiles {
    /// Makes the tiles usable on this thread while the returned guard lives: the hardware's
    /// configuration ([`Configured`]), nothing for the model.
    ///
    /// # Safety
    /// For the hardware: the CPU has AMX-TILE and the process the permission for its state.
    unsafe fn configure(&mut self) -> Option<Configured>;
    /// Tile `T` = 0.
    ///
    /// # Safety
    /// The tiles are configured on this thread ([`Tiles::configure`]'s guard lives).
    unsafe fn zero<const T: u8>(&mut self);
    /// Tile `T` = the 16 rows of 16 slots at `p`, row `r` at `p + r·stride` (in slots).
    ///
    /// # Safety
    /// As [`Tiles::zero`]; every row is valid to read.
    unsafe fn load<const T: u8>(&mut self, p: *const f32, stride: usize);
    /// The 16 rows of 16 slots at `p` (row `r` at `p + r·stride` slots) = tile `T`.
    ///
    /// # Safety
    /// As [`Tiles::zero`]; every row is valid to write.
    unsafe fn store<const T: u8>(&mut self, p: *mut f32, stride: usize);
    /// `TDPBF16PS`: tile `C` (f32) += tile `A` (bfloat16 pairs, `[16 rows][16 pairs]`) · tile `B`
    /// (bfloat16 pairs, `[16 pairs][16 columns]`): for each row `m`, column `n` and pair `k`,
    /// `c[m][n] += a[m][k].lo · b[k][n].lo + a[m][k].hi · b[k][n].hi`.
    ///
    /// # Safety
    /// As [`Tiles::zero`].
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self);
}

/// Whether the AMX tiles may run here, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The CPU lacks AMX-TILE or AMX-BF16 (or AVX-512F, which the kernel around them needs).
    NoCpu,
    /// The operating system refused the tile data state (or is not Linux).
    Refused,
    /// The tiles' self-test product differed from the model's: the path is not used.
    SelfTestFailed,
    /// The tiles run the bfloat16 products.
    Ready,
}

/// This CPU's and process's AMX [`Status`], established once (the permission request and the
/// self-test run on the first call).
pub fn status() -> Status {
    static STATUS: OnceLock<Status> = OnceLock::new();
    *STATUS.get_or_init(|| {
        if !hardware::cpu_has_amx() {
            Status::NoCpu
        } else if !hardware::request_permission() {
            Status::Refused
        } else if self_test::<Hardware>(&mut Hardware) == self_test(&mut Emulated::default()) {
            Status::Ready
        } else {
            Status::SelfTestFailed
        }
    })
}

/// Which tiles a call's bfloat16 products use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TileChoice {
    /// The hardware's when [`status`] is [`Status::Ready`], else none (the vector products).
    #[default]
    Auto,
    /// The software model, on any CPU (tests of the tile path; slow).
    Emulated,
    /// None: the vector products.
    Off,
}

/// The tiles a call runs on, resolved from a [`TileChoice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileUnit {
    /// [`Hardware`].
    Hardware,
    /// [`Emulated`].
    Emulated,
}

impl TileChoice {
    /// The unit this choice resolves to on this CPU, if any.
    pub fn resolve(self) -> Option<TileUnit> {
        match self {
            TileChoice::Auto => (status() == Status::Ready).then_some(TileUnit::Hardware),
            TileChoice::Emulated => Some(TileUnit::Emulated),
            TileChoice::Off => None,
        }
    }
}

/// FLOPs of one round of [`spin`]: four tile products of 16 × 16 × 32 multiply-adds.
pub const SPIN_FLOPS: f64 = (4 * TILE_ROWS * TILE_SLOTS * 32 * 2) as f64;

/// Runs `iters` rounds of four independent tile products (`TDPBF16PS` into four accumulators, the
/// operands zero) on the CPU's tiles, for a peak measurement ([`SPIN_FLOPS`] per round); `false`,
/// running nothing, unless [`status`] is [`Status::Ready`].
pub fn spin(iters: u64) -> bool {
    if status() != Status::Ready {
        return false;
    }
    let t = &mut Hardware;
    // SAFETY: the status is ready, so the CPU has the tiles and the process may use them; they
    // are configured while `_configured` lives.
    unsafe {
        let _configured = t.configure();
        t.zero::<0>();
        t.zero::<1>();
        t.zero::<2>();
        t.zero::<3>();
        t.zero::<4>();
        t.zero::<5>();
        t.zero::<6>();
        t.zero::<7>();
        for _ in 0..iters {
            t.dot::<0, 4, 6>();
            t.dot::<1, 4, 7>();
            t.dot::<2, 5, 6>();
            t.dot::<3, 5, 7>();
        }
    }
    true
}

/// One product `[16 × 32] · [32 × 16]` of small integers (exact in f32 whatever the order of the
/// sums) and one accumulated onto it, through `T`, as bits.
fn self_test<T: Tiles>(t: &mut T) -> Vec<u32> {
    let slot = |x: i32, y: i32| {
        let bits = |v: i32| half::bf16::from_f32(v as f32).to_bits();
        f32::from_bits(u32::from(bits(x)) | u32::from(bits(y)) << 16)
    };
    let a: Vec<f32> = (0..256).map(|i| slot(i % 7 - 3, i % 5 - 2)).collect();
    let b: Vec<f32> = (0..256).map(|i| slot(i % 3 - 1, i % 11 - 5)).collect();
    let mut c = vec![0f32; 256];
    // SAFETY: `status` tests the hardware only after the CPU check and the permission; the tiles
    // are configured while `_configured` lives; every buffer holds 16 rows of 16 slots.
    unsafe {
        let _configured = t.configure();
        t.zero::<0>();
        t.load::<1>(a.as_ptr(), TILE_SLOTS);
        t.load::<2>(b.as_ptr(), TILE_SLOTS);
        t.dot::<0, 1, 2>();
        t.dot::<0, 2, 1>();
        t.store::<0>(c.as_mut_ptr(), TILE_SLOTS);
    }
    c.iter().map(|x| x.to_bits()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_multiplies_pairs_as_the_instruction_does() {
        let pair = |lo: f32, hi: f32| {
            let b = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
            f32::from_bits(b(lo) | b(hi) << 16)
        };
        // a[m][k] = (m + k, 1), b[k][n] = (n, k - 2): c[m][n] = Σ_k (m + k)·n + (k - 2).
        let a: Vec<f32> = (0..256).map(|i| pair((i / 16 + i % 16) as f32, 1.0)).collect();
        let b: Vec<f32> = (0..256).map(|i| pair((i % 16) as f32, (i / 16) as f32 - 2.0)).collect();
        let mut c = vec![1.5f32; 256];
        let mut t = Emulated::default();
        // SAFETY: the model needs no configuration; every buffer holds 16 rows of 16 slots.
        unsafe {
            t.load::<5>(c.as_ptr(), TILE_SLOTS);
            t.load::<3>(a.as_ptr(), TILE_SLOTS);
            t.load::<7>(b.as_ptr(), TILE_SLOTS);
            t.dot::<5, 3, 7>();
            t.store::<5>(c.as_mut_ptr(), TILE_SLOTS);
        }
        for m in 0..16 {
            for n in 0..16 {
                let want: f32 = 1.5 + (0..16).map(|k| ((m + k) * n) as f32 + k as f32 - 2.0).sum::<f32>();
                assert_eq!(c[m * 16 + n], want, "c[{m}][{n}]");
            }
        }
        // Zeroed, stored at a stride: the rows land apart and the slots between stay.
        let mut wide = vec![9f32; 16 * 20];
        // SAFETY: as above; `wide` holds 16 rows at stride 20.
        unsafe {
            t.zero::<5>();
            t.store::<5>(wide.as_mut_ptr(), 20);
        }
        for (i, x) in wide.iter().enumerate() {
            assert_eq!(*x, if i % 20 < 16 { 0.0 } else { 9.0 }, "slot {i}");
        }
    }

    #[test]
    fn the_status_is_ready_only_with_the_cpu_features() {
        // On a CPU without AMX nothing is attempted; with it, the self-test decides.
        let s = status();
        assert_eq!(s == Status::NoCpu, !hardware::cpu_has_amx());
        assert_eq!(TileChoice::Auto.resolve().is_some(), s == Status::Ready);
        assert_eq!(TileChoice::Emulated.resolve(), Some(TileUnit::Emulated));
        assert_eq!(TileChoice::Off.resolve(), None);
        assert_eq!(spin(3), s == Status::Ready);
    }
}
