#!/usr/bin/env python3
"""Compare training steps per second of `attn train`'s default model with the same architecture
in PyTorch, trained on the same batches in the same order (issue 9).

The Rust side is the `train_steps` example of attn-train: `attn train`'s default configuration
(dates task, seed 0) and its real step (forward with dropout, masked cross-entropy, backward,
gradient clipping, AdamW at the schedule's rate) over steps 0..K of the run. Its first call also
exports those K batches (token ids with their padding), each step's learning rate and the
configuration, and this script builds from them:

  PyTorch: token embeddings (N(0, 1/d), times sqrt(d)) plus sinusoidal positions and dropout,
  nn.Transformer (post-norm, ReLU, the same width, heads, layers, feed-forward and dropout, final
  norms), a linear generator; masks from the ids (source padding for the encoder and the memory,
  causal plus target padding for the decoder); cross_entropy(ignore_index=pad); AdamW with the
  same betas, eps and weight decay (matrices only, as attn's AdamW) at the same rate per step;
  clip_grad_norm_ to the same limit.

The two models start from different random weights (PyTorch's own initialisation, which draws the
same scales but not the same numbers) and draw different dropout masks, so their losses agree in
kind, not digit for digit: the first losses are printed side by side.

Both use T threads (default 2): torch.set_num_threads(T); RAYON_NUM_THREADS=T and
CANDLE_NUM_THREADS=--candle-threads (1, as `attn train` runs) for the Rust side. Rounds alternate
(attn, torch, attn, torch, ...), each a fresh model trained on the K batches; steps per second
count the steps after the first --warmup. The ratio is torch time / attn time per step (>= 1:
attn trains as fast). With --profile, the Rust side then runs once more under `perf record`
and the split of its CPU time is printed (see scripts/rust_side.py).

Setup:  pip install -r scripts/requirements.txt      (PyTorch, CPU build is enough)
        cargo build --release -p attn-train --example train_steps
Usage:  python scripts/train_vs_torch.py [--bench target/release/examples/train_steps]
        [--threads 2] [--steps K] [--warmup W] [--rounds R] [--profile] [--json-out results.json]
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rust_side  # noqa: E402


def run_attn(binary, steps, warmup, env, export=None):
    """The example's JSON report of one run of `steps` steps (exporting the batches first)."""
    cmd = [binary, "--steps", str(steps), "--warmup", str(warmup)] + (["--export", export] if export else [])
    return rust_side.run_json(cmd, env)


def load_batches(torch, path, steps):
    """The exported batches as (src, tgt_in, tgt_out) int64 tensors, the rates, and the metadata;
    checks the layout the script relies on."""
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        batches = [tuple(f.get_tensor(f"{n}.{k}") for n in ("src", "tgt_in", "tgt_out")) for k in range(steps)]
        lrs = f.get_tensor("lr").tolist()
    pad, bos = int(meta["pad"]), int(meta["bos"])
    for k, (src, tgt_in, tgt_out) in enumerate(batches):
        real_in, real_out = tgt_in != pad, tgt_out != pad
        ok = (src.dtype == torch.int64 and src.dim() == 2 and tgt_in.shape == tgt_out.shape
              and src.shape[0] == tgt_in.shape[0] and bool((tgt_in[:, 0] == bos).all())
              and bool((real_in == real_out).all())  # the same length, shifted by one
              and bool((tgt_in[:, 1:][real_in[:, 1:]] == tgt_out[:, :-1][real_in[:, 1:]]).all()))
        if not ok:
            sys.exit(f"error: {path}: batch {k} is not bos + target / target + eos with shared padding")
    if len(lrs) != steps:
        sys.exit(f"error: {path}: {len(lrs)} learning rates for {steps} steps")
    return batches, lrs, json.loads(meta["model"]), json.loads(meta["train"]), pad


def sinusoidal(torch, max_len, d):
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)): attn-nn's table."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-(torch.arange(d) - torch.arange(d) % 2).double() / d)
    angle = pos * freq
    table = torch.where(torch.arange(d) % 2 == 0, angle.sin(), angle.cos())
    return table.float()


def build_model(torch, model, pad):
    nn = torch.nn
    d, v = model["d_model"], model["vocab"]

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_embed, self.tgt_embed = nn.Embedding(v, d), nn.Embedding(v, d)
            for e in (self.src_embed, self.tgt_embed):
                nn.init.normal_(e.weight, std=d ** -0.5)
            self.register_buffer("pe", sinusoidal(torch, model["max_len"], d))
            self.src_drop, self.tgt_drop = nn.Dropout(model["dropout"]), nn.Dropout(model["dropout"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                self.transformer = nn.Transformer(d, model["heads"], model["layers"], model["layers"], model["ff"],
                                                  model["dropout"], batch_first=True)
            self.generator = nn.Linear(d, v)

        def embed(self, table, drop, ids):
            return drop(table(ids) * math.sqrt(d) + self.pe[: ids.shape[1]])

        def forward(self, src, tgt):
            src_pad, tgt_pad = src == pad, tgt == pad  # True = masked, PyTorch's module convention
            lt = tgt.shape[1]
            causal = torch.triu(torch.ones(lt, lt, dtype=torch.bool), diagonal=1)
            out = self.transformer(self.embed(self.src_embed, self.src_drop, src),
                                   self.embed(self.tgt_embed, self.tgt_drop, tgt), tgt_mask=causal,
                                   src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                   memory_key_padding_mask=src_pad, tgt_is_causal=True)
            return self.generator(out)

    return Seq2Seq()


def train_torch(torch, batches, lrs, model, train, pad, warmup):
    """Trains a fresh model on the batches; returns steps per second after `warmup` steps and the
    losses."""
    torch.manual_seed(train["seed"])
    m = build_model(torch, model, pad)
    m.train()
    params = list(m.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": train["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lrs[0], betas=(0.9, 0.999), eps=1e-8)
    f = torch.nn.functional
    losses, times = [], []
    for (src, tgt_in, tgt_out), lr in zip(batches, lrs):
        start = time.perf_counter()
        logits = m(src, tgt_in)
        loss = f.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=pad)
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train["clip"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        times.append(time.perf_counter() - start)
    return (len(times) - warmup) / sum(times[warmup:]), losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rust_side.add_options(p, "train_steps", 2)
    p.add_argument("--steps", type=int, default=40, help="training steps per round (the first K batches)")
    p.add_argument("--warmup", type=int, default=5, help="steps per round left out of steps per second")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    a = p.parse_args()
    if a.rounds < 1 or not 0 <= a.warmup < a.steps:
        sys.exit("error: --rounds must be >= 1, 0 <= --warmup < --steps")
    torch, env = rust_side.start(a, "cargo build --release -p attn-train --example train_steps")

    attn_sps, torch_sps, attn_runs, torch_losses = [], [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "batches.safetensors")
        attn_runs.append(run_attn(a.bench, a.steps, a.warmup, env, export=path))
        batches, lrs, model, train, pad = load_batches(torch, path, a.steps)
        cfg = (f"d_model {model['d_model']}, {model['heads']} heads, {model['layers']}+{model['layers']} layers, "
               f"ff {model['ff']}, dropout {model['dropout']}, vocab {model['vocab']}, batch {train['batch']}")
        print(f"threads={a.threads} candle_threads={a.candle_threads} steps={a.steps} warmup={a.warmup} "
              f"rounds={a.rounds} torch={torch.__version__}\nmodel: {cfg}")
        for r in range(a.rounds):
            if r > 0:
                attn_runs.append(run_attn(a.bench, a.steps, a.warmup, env))
            sps, losses = train_torch(torch, batches, lrs, model, train, pad, a.warmup)
            torch_sps.append(sps)
            torch_losses = torch_losses or losses
            attn_sps.append(attn_runs[-1]["steps_per_s"])
            print(f"round {r + 1}: torch {sps:.2f} steps/s, attn {attn_sps[-1]:.2f} steps/s", flush=True)
    profile = None
    if a.profile:
        profile = rust_side.profile(
            [a.bench, "--steps", str(a.steps), "--warmup", str(a.warmup)], env,
            lambda r: (f"where attn's CPU time goes: perf over setting up the run ({r['setup_s']:.2f} s) and "
                       f"{a.steps} training steps ({sum(r['step_s']):.2f} s)"), top=15)
    t, s = statistics.median(torch_sps), statistics.median(attn_sps)
    print(f"\n{'':<6} {'steps/s':>8} {'ms/step':>8}\n{'torch':<6} {t:>8.2f} {1e3 / t:>8.1f}\n{'attn':<6} {s:>8.2f} "
          f"{1e3 / s:>8.1f}\ntorch time / attn time: {s / t:.2f}")
    n = 5
    print(f"first losses (different initial weights and dropout masks, see --help):\n"
          f"  torch {' '.join(f'{x:.3f}' for x in torch_losses[:n])} ... step {a.steps}: {torch_losses[-1]:.3f}\n"
          f"  attn  {' '.join(f'{x:.3f}' for x in attn_runs[0]['loss'][:n])} ... step {a.steps}: "
          f"{attn_runs[0]['loss'][-1]:.3f}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "candle_threads": a.candle_threads, "torch": torch.__version__,
                       "steps": a.steps, "warmup": a.warmup, "model": model, "train": train,
                       "torch_steps_per_s": torch_sps, "attn_steps_per_s": attn_sps, "ratio": s / t,
                       "torch_losses": torch_losses, "attn_losses": attn_runs[0]["loss"],
                       "profile": profile}, f, indent=2)


if __name__ == "__main__":
    main()
