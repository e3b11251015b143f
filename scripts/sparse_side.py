#!/usr/bin/env python3
"""The block-sparse side of bench_vs_torch.py: a pattern's dense boolean mask as attn itself
writes it, the Longformer mask checked against the paper's definition, and the peak memory of one
call on each side, each in a fresh process.

Peak memory: attn's is what `attn bench --iters 1 --warmup 0` reports (the allocator's high-water
mark beyond the call's outputs) plus the block mask's bytes. PyTorch's is measured in a fresh
Python process (this file run as a script): inputs and the dense mask are made, the resident
set's high-water mark is reset (`5` written to /proc/self/clear_refs), one call is made on the
backend the timing used, and the growth of the high-water mark over the resident set before the
call is the call's peak (which includes its outputs: `out`, and with the backward `dq`, `dk`,
`dv`). Large buffers are fresh pages on Linux (glibc maps them), so nothing freed before the call
hides them.
"""

import json
import os
import subprocess
import sys
import tempfile


def dense_mask(binary, shape):
    """The keep mask `[Lq, Lk]` (numpy bool) of `shape`'s pattern (with causal), as `attn run
    --weights` writes it for small inputs of the shape's lengths."""
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        q = np.zeros((1, 1, shape.lq, 8), np.float32)
        kv = np.zeros((1, 1, shape.lk, 8), np.float32)
        np.savez(os.path.join(tmp, "in.npz"), q=q, k=kv, v=kv)
        out = os.path.join(tmp, "out.npz")
        cmd = [binary, "run", os.path.join(tmp, "in.npz"), "-o", out, "--weights", *shape.pattern_args()]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
        return np.load(out)["mask"][0, 0].copy()


def check_against_paper(shape, mask):
    """For Longformer, exits unless `mask` is the paper's: a sliding window of `left` keys before
    and `right` after the diagonal, and the first `global` tokens' rows and columns (with causal,
    only keys up to the query); other patterns pass unchecked (BigBird's random blocks are attn's
    own draw)."""
    if shape.pattern != "longformer":
        return
    import numpy as np
    flags = dict(zip(shape.pattern_flags[::2], shape.pattern_flags[1::2]))
    left, right = (int(x) for x in flags["--window"].split(","))
    g = int(flags["--global"])
    i = np.arange(shape.lq)[:, None]
    j = np.arange(shape.lk)[None, :]
    left_ok = (j >= i - left) if left >= 0 else True
    right_ok = (j <= i + right) if right >= 0 else True
    want = (left_ok & right_ok) | (i < g) | (j < g)
    if shape.causal:
        want &= j <= i
    if not np.array_equal(mask, want):
        sys.exit(f"error: attn's mask for {shape.spec} differs from Longformer's definition at "
                 f"{int((mask != want).sum())} pairs")


def attn_peak(binary, shape, threads, kernel, backward):
    """attn's peak memory of one call: `(extra_bytes, mask_bytes)` from `attn bench`."""
    cmd = [binary, "bench", *shape.attn_args(backward), "--threads", str(threads), "--kernel", kernel,
           "--warmup", "0", "--iters", "1", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return row["extra_bytes"], row["mask_bytes"] or 0


def torch_peak(spec, mask, threads, backward, backend):
    """PyTorch's peak memory of one call on `backend` with the dense `mask`, in bytes, measured in
    a fresh process (see the module header)."""
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mask.npy")
        np.save(path, mask)
        cmd = [sys.executable, os.path.abspath(__file__), spec, path, str(threads), str(int(backward)), backend]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr.strip()}")
        return int(done.stdout.strip().splitlines()[-1])


def status_kib(field):
    """A `kB` field of /proc/self/status, such as VmRSS or VmHWM."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    sys.exit(f"error: no {field} in /proc/self/status")


def measure_one_call():
    """The child: argv = SPEC MASK.npy THREADS BACKWARD BACKEND; prints the peak bytes."""
    import numpy as np
    import torch
    from bench_vs_torch import Shape, torch_call
    spec, mask_path, threads, backward, backend = sys.argv[1:6]
    torch.set_num_threads(int(threads))
    mask = torch.from_numpy(np.load(mask_path))
    backend_ctx, call, _ = torch_call(torch, Shape(spec), backward == "1", mask, backend)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    with backend_ctx():
        call()
    print((status_kib("VmHWM") - before) * 1024)


if __name__ == "__main__":
    measure_one_call()
