//! A software model of the AMX tile operations ([`super::Tiles`]): eight tiles of 16 × 16 32-bit
//! slots in memory, `TDPBF16PS` as its pseudocode reads (pairs in order, each product exact in
//! f32). It differs from the hardware only on subnormal inputs and results, which the hardware
//! flushes to zero. Slow; for tests of the tile path on any CPU.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Configured, Tiles, TILE_ROWS, TILE_SLOTS};

/// `TDPBF16PS` instructions modelled in this process.
static PRODUCTS: AtomicU64 = AtomicU64::new(0);

/// The eight tiles' contents.
#[derive(Debug, Clone)]
pub struct Emulated {
    tiles: [[[u32; TILE_SLOTS]; TILE_ROWS]; 8],
}

impl Emulated {
    /// How many tile products (`TDPBF16PS`) the model has run in this process: tests see by it
    /// that a call really ran on tiles.
    pub fn products() -> u64 {
        PRODUCTS.load(Ordering::Relaxed)
    }
}

impl Default for Emulated {
    fn default() -> Self {
        Emulated { tiles: [[[0; TILE_SLOTS]; TILE_ROWS]; 8] }
    }
}

/// The low and high bfloat16 halves of a slot, widened to f32.
fn halves(x: u32) -> (f32, f32) {
    (f32::from_bits(x << 16), f32::from_bits(x & 0xFFFF_0000))
}

impl Tiles for Emulated {
    unsafe fn configure(&mut self) -> Option<Configured> {
        None
    }

    #[inline(never)]
    unsafe fn zero<const T: u8>(&mut self) {
        self.tiles[T as usize] = [[0; TILE_SLOTS]; TILE_ROWS];
    }

    #[inline(never)]
    unsafe fn load<const T: u8>(&mut self, p: *const f32, stride: usize) {
        for (r, row) in self.tiles[T as usize].iter_mut().enumerate() {
            // SAFETY: row `r` is valid to read (the caller's contract).
            let src = unsafe { std::slice::from_raw_parts(p.add(r * stride), TILE_SLOTS) };
            row.iter_mut().zip(src).for_each(|(x, y)| *x = y.to_bits());
        }
    }

    #[inline(never)]
    unsafe fn store<const T: u8>(&mut self, p: *mut f32, stride: usize) {
        for (r, row) in self.tiles[T as usize].iter().enumerate() {
            // SAFETY: row `r` is valid to write (the caller's contract).
            let dst = unsafe { std::slice::from_raw_parts_mut(p.add(r * stride), TILE_SLOTS) };
            dst.iter_mut().zip(row).for_each(|(x, y)| *x = f32::from_bits(*y));
        }
    }

    #[inline(never)]
    unsafe fn dot<const C: u8, const A: u8, const B: u8>(&mut self) {
        PRODUCTS.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (self.tiles[A as usize], self.tiles[B as usize]);
        for (m, crow) in self.tiles[C as usize].iter_mut().enumerate() {
            for (k, brow) in b.iter().enumerate() {
                let (alo, ahi) = halves(a[m][k]);
                for (c, &bk) in crow.iter_mut().zip(brow) {
                    let (blo, bhi) = halves(bk);
                    let acc = f32::from_bits(*c) + alo * blo;
                    *c = (acc + ahi * bhi).to_bits();
                }
            }
        }
    }
}
