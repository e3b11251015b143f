#!/usr/bin/env python3
"""`.npz` fixtures written by NumPy itself, for `crates/attn-cli/tests/io_npz.rs`: the archives
`np.savez` (stored members) and `np.savez_compressed` (deflated members) make, so the reader is
tested on NumPy's real zip layout (zip64 extra fields included) without Python in `cargo test`.

Run from the repository root with any Python that has NumPy (the output is deterministic):

    python3 scripts/gen_npz_fixtures.py

Both archives hold the same arrays, whose values the test recomputes from these formulas:
- `q`: float32 `[1, 2, 3, 4]`, element `i` (row-major) = `i * 0.25 - 3`;
- `k`: float16 `[1, 1, 3, 4]`, element `i` = `i * 0.5 - 2`;
- `v`: float64 `[1, 1, 3, 2]`, element `i` = `i - 2.5`;
- `mask`: bool `[3, 3]`, the lower triangle (`j <= i`) true;
- `key_lengths`: int64 `[1]` = `[2]`.
"""

import pathlib

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "crates" / "attn-cli" / "tests" / "fixtures"


def arrays():
    return {
        "q": (np.arange(24, dtype=np.float64) * 0.25 - 3).astype(np.float32).reshape(1, 2, 3, 4),
        "k": (np.arange(12, dtype=np.float64) * 0.5 - 2).astype(np.float16).reshape(1, 1, 3, 4),
        "v": (np.arange(6, dtype=np.float64) - 2.5).reshape(1, 1, 3, 2),
        "mask": np.tril(np.ones((3, 3), dtype=bool)),
        "key_lengths": np.array([2], dtype=np.int64),
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez(OUT / "numpy_savez.npz", **arrays())
    np.savez_compressed(OUT / "numpy_savez_compressed.npz", **arrays())
    for name in ("numpy_savez.npz", "numpy_savez_compressed.npz"):
        print(f"wrote {OUT / name} ({(OUT / name).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
