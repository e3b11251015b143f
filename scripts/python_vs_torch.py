#!/usr/bin/env python3
"""attn from Python (the `attn` package, `python/`) against PyTorch's CPU
scaled_dot_product_attention, in the same process, on the same threads, alternating round by
round; beside them the `attn bench` binary, so that the Python call's ratio can be set against
the binary's (issue 20: at least 90% of it).

Sections (all by default; pick with --only):
  forward   the forward shapes of bench_vs_torch.py, under torch.inference_mode (per round: torch,
            a pause of --settle seconds for its OpenMP threads to stop spinning, then attn from
            Python and the binary, in alternating order)
  backward  forward + backward (autograd, `out.backward(grad)`) at bench_vs_torch.py's gradient shapes
  overhead  the per-call cost at 1,8,128,64 (no gradient): attn.sdpa on tensors and on NumPy
            arrays, the native call alone, and `attn bench`'s kernel time; overhead = Python
            call − kernel
  hf        a Hugging Face training step (forward, backward, AdamW) with
            attn_implementation="attn" against "sdpa" (Llama) or "eager" (gpt-oss, --hf-model
            gpt_oss: learned sinks, which sdpa cannot run), at sequence lengths 512 and 2048,
            alternating (in turn first) round by round
            (--hf-impl attn, then --hf-impl sdpa, times each in a process of its own)

Setup:  pip install -r scripts/requirements.txt transformers && pip install ./python
        cargo build --release -p attn-cli
Usage:  python scripts/python_vs_torch.py --attn target/release/attn --threads 2 [--rounds 3]
        [--only forward backward overhead hf] [--json-out results.json]
Medians over rounds of per-round medians; ratios are PyTorch time / attn time (above 1: attn is
faster).
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_side import median_seconds  # noqa: E402


def attn_call(torch, attn, shape, backward):
    """One attn.sdpa call (with `backward`: forward plus autograd backward) on fresh inputs of
    `shape`, as bench_vs_torch.py's `torch_call` makes them."""
    q = torch.randn(shape.b, shape.h, shape.lq, shape.d, requires_grad=backward)
    k = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, requires_grad=backward)
    v = torch.randn(shape.b, shape.hkv, shape.lk, shape.d, requires_grad=backward)
    grad = torch.randn(shape.b, shape.h, shape.lq, shape.d)
    kw = dict(is_causal=shape.causal, dropout_p=shape.dropout, enable_gqa=shape.hkv != shape.h)

    def call():
        if not backward:
            with torch.inference_mode():
                attn.sdpa(q, k, v, **kw)
            return
        attn.sdpa(q, k, v, **kw).backward(grad)
        q.grad = k.grad = v.grad = None

    return call


def kernels(a, torch, attn, bench, backward):
    """Forward or forward + backward: torch, attn from Python and the binary, alternating."""
    shapes = [bench.Shape(s) for s in (bench.BACKWARD_SHAPES if backward else bench.DEFAULT_SHAPES)]
    print(f"\n{'forward + backward' if backward else 'forward'}: ms (medians of {a.rounds} rounds)")
    print(f"{'shape':<28} {'torch':>9} {'attn py':>9} {'attn bin':>9} {'py ratio':>9} {'bin ratio':>9} {'py/bin':>7}")
    rows = []
    for shape in shapes:
        t, p, r = [], [], []
        ctx, tcall, backend = bench.torch_call(torch, shape, backward, None)
        pcall = attn_call(torch, attn, shape, backward)
        for i in range(a.rounds):
            with ctx():
                t.append(median_seconds(tcall, a.reps, a.warmup))
            # PyTorch's OpenMP workers spin for milliseconds after its last operation; let them
            # settle, and alternate which attn side goes first, so both meet the same conditions.
            time.sleep(a.settle)
            sides = [lambda: p.append(median_seconds(pcall, a.reps, a.warmup))]
            if a.attn:
                sides.append(lambda: r.append(
                    bench.time_attn(a.attn, shape, a.threads, a.reps, a.warmup, "auto", backward)))
            for side in sides[:: 1 if i % 2 == 0 else -1]:
                side()
        t, p = statistics.median(t), statistics.median(p)
        r = statistics.median(r) if r else float("nan")
        row = {"shape": shape.spec, "backward": backward, "torch_backend": backend, "torch_ms": t * 1e3,
               "attn_python_ms": p * 1e3, "attn_binary_ms": r * 1e3, "python_ratio": t / p, "binary_ratio": t / r}
        rows.append(row)
        print(f"{shape.spec:<28} {t * 1e3:>9.3f} {p * 1e3:>9.3f} {r * 1e3:>9.3f} {t / p:>9.2f} {t / r:>9.2f} "
              f"{(t / p) / (t / r):>7.2f}", flush=True)
    return rows


def overhead(a, torch, attn, bench):
    """Per-call cost at 1,8,128,64, forward, no gradient."""
    from attn import _attn

    shape = bench.Shape("1,8,128,64")
    q, k, v = (torch.randn(1, 8, 128, 64) for _ in range(3))
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    opts = dict(keep=None, bias=None, causal=False, window=None, bottom_right=False, key_lengths=None, scale=None,
                softcap=None, dropout_p=0.0, seed=0, bf16_products=False)
    ctx, tcall, _ = bench.torch_call(torch, shape, False, None)
    calls = {
        "torch F.sdpa": tcall,
        "attn.sdpa (tensors)": lambda: attn.sdpa(q, k, v),
        "attn.sdpa (numpy)": lambda: attn.sdpa(qn, kn, vn),
        "native forward": lambda: _attn.forward(qn.__dlpack__(), kn.__dlpack__(), vn.__dlpack__(), opts, False),
    }
    reps = a.reps * 200
    times = {name: [] for name in list(calls) + ["attn bench (kernel)"]}
    for _ in range(a.rounds):
        for name, call in calls.items():
            with ctx():
                times[name].append(median_seconds(call, reps, reps // 10))
        if a.attn:
            times["attn bench (kernel)"].append(bench.time_attn(a.attn, shape, a.threads, reps, reps // 10, "auto", False))
    med = {name: statistics.median(ts) * 1e6 if ts else float("nan") for name, ts in times.items()}
    kernel = med["attn bench (kernel)"]
    print(f"\nper-call cost at 1,8,128,64, µs (medians of {a.rounds} rounds of {reps} calls)")
    for name, us in med.items():
        extra = f"   overhead over the kernel {us - kernel:7.1f}" if name.startswith(("attn.", "native")) else ""
        print(f"{name:<24} {us:9.1f}{extra}")
    return med


def hf_model(name, transformers):
    """``(model class, config, the implementation attn is compared with)`` of a timed HF model:
    hidden 512, 8 heads of 64, 2 layers. gpt-oss has learned sinks, which PyTorch's ``sdpa`` cannot
    run: its comparison is ``eager``."""
    if name == "llama":
        cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096,
                                       attention_dropout=0.0)
        return transformers.LlamaForCausalLM, cfg, "sdpa"
    cfg = transformers.GptOssConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                    num_attention_heads=8, num_key_value_heads=8, head_dim=64, num_local_experts=2,
                                    num_experts_per_tok=2, sliding_window=128, max_position_embeddings=4096,
                                    attention_dropout=0.0)
    return transformers.GptOssForCausalLM, cfg, "eager"


def hf_step(a, torch):
    """A training step (forward, backward, AdamW) of a small HF model with each implementation."""
    import transformers

    import attn.hf

    attn.hf.register()
    cls, cfg, ref = hf_model(a.hf_model, transformers)
    impls = [i for i in (a.hf_impl or [ref, "attn"]) if i in (ref, "attn")]
    print(f"\nHF {a.hf_model} training step (hidden 512, 8 heads of 64, 2 layers, batch 1), ms")
    print(f"{'seq':>6} {ref:>10} {'attn':>10} {ref + '/attn':>12}")
    rows = []
    for seq in (512, 2048):
        torch.manual_seed(0)
        state = cls._from_config(cfg).state_dict()
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        steps = {}
        for impl in impls:
            # A config of its own: `_from_config` records the implementation on the config, which a
            # shared one would hand to every model built from it (the last one's for all).
            model = cls._from_config(copy.deepcopy(cfg), attn_implementation=impl)
            assert model.config._attn_implementation == impl
            model.load_state_dict(state)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step(model=model, opt=opt):
                opt.zero_grad()
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()

            steps[impl] = step
        times = {impl: [] for impl in steps}
        for i in range(a.rounds):
            for impl, step in list(steps.items())[:: 1 if i % 2 == 0 else -1]:
                times[impl].append(median_seconds(step, a.reps, 1))
        med = {impl: statistics.median(times[impl]) * 1e3 if impl in times else float("nan") for impl in (ref, "attn")}
        rows.append({"seq": seq, "model": a.hf_model, "ref": ref, "ref_ms": med[ref], "attn_ms": med["attn"],
                     "ratio": med[ref] / med["attn"]})
        print(f"{seq:>6} {med[ref]:>10.1f} {med['attn']:>10.1f} {med[ref] / med['attn']:>12.2f}", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attn", help="the attn binary, for the kernel-only figures (cargo build --release -p attn-cli)")
    p.add_argument("--threads", type=int, default=2, help="threads for both (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    p.add_argument("--reps", type=int, default=5, help="timed calls per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per round")
    p.add_argument("--only", nargs="+", choices=["forward", "backward", "overhead", "hf"],
                   default=["forward", "backward", "overhead", "hf"])
    p.add_argument("--hf-model", choices=["llama", "gpt_oss"], default="llama",
                   help="the HF model: llama (against sdpa) or gpt_oss (learned sinks; against eager)")
    p.add_argument("--hf-impl", nargs="+", choices=["sdpa", "eager", "attn"],
                   help="the HF implementations to time (default: the model's comparison and attn; one per "
                        "process: no interference between them)")
    p.add_argument("--settle", type=float, default=0.05,
                   help="seconds to wait after each PyTorch round before the attn rounds (default 0.05)")
    p.add_argument("--json-out", help="also write the results to this JSON file")
    a = p.parse_args()
    if a.threads < 1 or a.rounds < 1 or a.reps < 1 or a.warmup < 0:
        sys.exit("error: --threads, --rounds and --reps must be >= 1, --warmup >= 0")
    if a.attn and not os.access(a.attn, os.X_OK):
        sys.exit(f"error: --attn {a.attn} is not an executable (cargo build --release -p attn-cli)")
    # The kernels' thread pool reads this when it starts, at the first call.
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    try:
        import torch

        import attn
        import bench_vs_torch as bench
    except ImportError as e:
        sys.exit(f"error: {e} (pip install -r scripts/requirements.txt transformers && pip install ./python)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    print(f"threads={a.threads} rounds={a.rounds} reps={a.reps} torch={torch.__version__} isa={attn.ISA}")
    results = {}
    for section in a.only:
        if section in ("forward", "backward"):
            results[section] = kernels(a, torch, attn, bench, section == "backward")
        elif section == "overhead":
            results[section] = overhead(a, torch, attn, bench)
        else:
            results[section] = hf_step(a, torch)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "rounds": a.rounds, "reps": a.reps, "torch": torch.__version__,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
