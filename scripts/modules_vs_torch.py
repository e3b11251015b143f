#!/usr/bin/env python3
"""Compare forward + backward of attn-nn's `EncoderLayer` and `Transformer` with PyTorch's
`nn.TransformerEncoderLayer` and `nn.Transformer` on the same sizes (issue 8).

A call on both sides: the module's forward in training mode with dropout 0 (post-norm, ReLU, the
target causal in the Transformer, no padding), the loss sum(out * g) for a fixed random g, and the
backward to every parameter (inputs constant); gradients are fresh each call. Default sizes:
an encoder layer with d_model 512, 8 heads, feed-forward 2048, batch 8, L 512; a Transformer of
2 encoder + 2 decoder layers of those widths, batch 8, source and target L 256. f32 throughout.

Threads: torch.set_num_threads(T); the Rust side gets RAYON_NUM_THREADS=T (candle's matrix
products and our attention kernels) and CANDLE_NUM_THREADS=--candle-threads (candle's element-wise
pool: 1 by default, as the `attn` binary sets it, because that pool spins while it waits and costs
more than it saves on small tensors). For each module the two are timed in alternating rounds
(torch, attn, torch, attn, ...); a round reports the median of --reps calls after --warmup calls,
the table the median over rounds and the ratio torch time / attn time (>= 1: attn is as fast).

With --profile, the Rust side of each module is then run once more under `perf record` and the
split of its CPU time is printed (gemm, attention kernel, element-wise, allocation and page
faults, thread sync; see scripts/rust_side.py).

Setup:  pip install -r scripts/requirements.txt      (PyTorch, CPU build is enough)
        cargo build --release -p attn-nn --example bench_modules
Usage:  python scripts/modules_vs_torch.py [--bench target/release/examples/bench_modules]
        [--threads T] [--modules encoder-layer transformer] [--batch B] [--len L] [--rounds R]
        [--reps N] [--warmup W] [--candle-threads C] [--profile] [--json-out results.json]
"""

import argparse
import json
import os
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rust_side  # noqa: E402

MODULES = {"encoder-layer": 512, "transformer": 256}  # module -> default sequence length


class Sizes:
    def __init__(self, module, a):
        self.module = module
        self.batch, self.len = a.batch, a.len or MODULES[module]
        self.d_model, self.heads, self.ff, self.layers = a.d_model, a.heads, a.ff, a.layers

    def args(self):
        return ["--module", self.module, "--batch", str(self.batch), "--len", str(self.len),
                "--d-model", str(self.d_model), "--heads", str(self.heads), "--ff", str(self.ff),
                "--layers", str(self.layers)]

    def label(self):
        layers = "" if self.module == "encoder-layer" else f" {self.layers}+{self.layers}"
        return f"{self.module}{layers} B{self.batch} L{self.len}"


def torch_call(torch, s):
    """The PyTorch module of `s` and one timed call: forward, loss, backward, fresh gradients."""
    nn = torch.nn
    shape = (s.batch, s.len, s.d_model)
    src, tgt, g = (torch.rand(shape) * 2 - 1 for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested-tensor notes about the fast path
        if s.module == "encoder-layer":
            m = nn.TransformerEncoderLayer(s.d_model, s.heads, s.ff, dropout=0.0, batch_first=True)

            def forward():
                return m(src)
        else:
            m = nn.Transformer(s.d_model, s.heads, s.layers, s.layers, s.ff, dropout=0.0, batch_first=True)
            causal = torch.triu(torch.ones(s.len, s.len, dtype=torch.bool), diagonal=1)  # True = masked

            def forward():
                return m(src, tgt, tgt_mask=causal, tgt_is_causal=True)
    m.train()

    def call():
        (forward() * g).sum().backward()
        m.zero_grad(set_to_none=True)
    return call


def time_torch(torch, s, reps, warmup):
    return rust_side.median_seconds(torch_call(torch, s), reps, warmup)


def time_attn(binary, s, reps, warmup, env):
    row = rust_side.run_json([binary, *s.args(), "--warmup", str(warmup), "--iters", str(reps)], env)
    if (row["batch"], row["len"], row["d_model"]) != (s.batch, s.len, s.d_model):
        sys.exit(f"error: {binary} ran {row}, not {s.label()}")
    return row["median_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rust_side.add_options(p, "bench_modules", cores)
    p.add_argument("--modules", nargs="+", choices=list(MODULES), default=list(MODULES))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--len", type=int, help="sequence length (default: 512 encoder layer, 256 Transformer)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers (each) of the Transformer")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per module")
    p.add_argument("--reps", type=int, default=5, help="timed calls per round")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per round (attn: at least 1)")
    a = p.parse_args()
    sizes = [a.batch, a.d_model, a.heads, a.ff, a.layers, a.rounds, a.reps]
    if min(sizes) < 1 or a.warmup < 0 or (a.len is not None and a.len < 1) or a.d_model % a.heads:
        sys.exit("error: sizes, --rounds and --reps must be >= 1, --warmup >= 0, --heads must divide --d-model")
    torch, env = rust_side.start(a, "cargo build --release -p attn-nn --example bench_modules")
    torch.manual_seed(0)

    print(f"threads={a.threads} candle_threads={a.candle_threads} rounds={a.rounds} reps={a.reps} "
          f"warmup={a.warmup} torch={torch.__version__} forward+backward, d_model {a.d_model}, "
          f"{a.heads} heads, ff {a.ff}")
    print(f"{'module':<30} {'torch ms':>10} {'attn ms':>10} {'torch/attn':>10}")
    results = []
    for module in a.modules:
        s = Sizes(module, a)
        torch_t, attn_t = [], []
        for _ in range(a.rounds):
            torch_t.append(time_torch(torch, s, a.reps, a.warmup))
            attn_t.append(time_attn(a.bench, s, a.reps, a.warmup, env))
        t, r = statistics.median(torch_t), statistics.median(attn_t)
        row = {"module": module, "label": s.label(), "torch_ms": t * 1e3, "attn_ms": r * 1e3, "ratio": t / r,
               "torch_round_ms": [x * 1e3 for x in torch_t], "attn_round_ms": [x * 1e3 for x in attn_t]}
        results.append(row)
        print(f"{s.label():<30} {row['torch_ms']:>10.1f} {row['attn_ms']:>10.1f} {row['ratio']:>10.2f}", flush=True)
    if a.profile:
        for row in results:
            s = Sizes(row["module"], a)
            row["profile"] = rust_side.profile(
                [a.bench, *s.args(), "--warmup", "1", "--iters", str(a.reps)], env,
                lambda r: (f"where attn's CPU time goes, {s.label()}: perf over building the module "
                           f"({r['setup_s']:.2f} s), 1 untimed and {a.reps} timed calls ({sum(r['times_s']):.2f} s)"))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "candle_threads": a.candle_threads, "torch": torch.__version__,
                       "rounds": a.rounds, "reps": a.reps, "warmup": a.warmup, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
