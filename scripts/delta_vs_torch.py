#!/usr/bin/env python3
"""Compare attn's gated delta rule (``attn.fla``) with ``transformers``' PyTorch fallbacks, the code
Qwen3-Next, Qwen3.5 and OLMo-hybrid run on a CPU without ``fla``: ``torch_chunk_gated_delta_rule``
(forward, and forward + autograd's backward) and ``torch_recurrent_gated_delta_rule`` for one decode
step against a state. Same process, same inputs, the same thread count for both (``torch`` and
attn's pool), L2-normalised q and k, float32; timed in alternating rounds (torch, attn, torch,
attn, ...), each round the median of ``--reps`` calls, the table the median over rounds. The
results are checked against each other first.

Setup:  scripts/ci_python.sh --prepare (or pip install torch transformers), and the package built
        (pip install ./python, or PYTHONPATH at a staged package)
Usage:  python scripts/delta_vs_torch.py [--threads 2] [--rounds 5] [--reps 3] [--t 4096]
        [--hk 8] [--hv 16] [--d 128] [--batch 1] [--decode-batch 8]
"""

import argparse
import statistics
import time

import torch


def timed(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--t", type=int, default=4096)
    ap.add_argument("--hk", type=int, default=8)
    ap.add_argument("--hv", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--decode-batch", type=int, default=8)
    a = ap.parse_args()

    import attn
    import attn.fla as fla
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    torch.set_num_threads(a.threads)
    attn.set_num_threads(a.threads)
    chunk_torch = m.torch_chunk_gated_delta_rule.__wrapped__
    recurrent_torch = m.torch_recurrent_gated_delta_rule.__wrapped__

    def inputs(b, t):
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(b, t, a.hk, a.d, generator=gen)
        k = torch.randn(b, t, a.hk, a.d, generator=gen)
        v = torch.randn(b, t, a.hv, a.d, generator=gen)
        g = -0.2 * torch.rand(b, t, a.hv, generator=gen) - 0.01
        beta = torch.rand(b, t, a.hv, generator=gen)
        s0 = 0.1 * torch.randn(b, a.hv, a.d, a.d, generator=gen)
        return q, k, v, g, beta, s0

    def call(fn, x, backward):
        # Fresh leaves only for the backward: a clone of the 8 MiB decode states would be most of a
        # decode step's time, on both sides.
        q, k, v, g, beta, s0 = (t.clone().requires_grad_() for t in x) if backward else x
        o, final = fn(q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        if backward:
            (o.sum() + final.sum()).backward()
            return o.detach(), final.detach(), q.grad
        return o, final, None

    rows = []
    prefill = inputs(a.batch, a.t)
    decode = inputs(a.decode_batch, 1)
    cases = [
        (f"forward B {a.batch} T {a.t}", chunk_torch, fla.chunk_gated_delta_rule, prefill, False),
        (f"forward + backward B {a.batch} T {a.t}", chunk_torch, fla.chunk_gated_delta_rule, prefill, True),
        (f"decode step B {a.decode_batch}", recurrent_torch, fla.fused_recurrent_gated_delta_rule, decode, False),
    ]
    for name, theirs, ours, x, backward in cases:
        want = call(theirs, x, backward)
        got = call(ours, x, backward)
        for w, g_ in zip(want, got):
            if w is not None:
                diff = (w - g_).abs().max().item()
                assert diff <= 1e-3 * (1 + w.abs().max().item()), f"{name}: results differ by {diff}"
        with torch.no_grad() if not backward else torch.enable_grad():
            ts, ta = [], []
            for _ in range(a.rounds):
                ts.append(timed(lambda: call(theirs, x, backward), a.reps))
                ta.append(timed(lambda: call(ours, x, backward), a.reps))
        t_med, a_med = statistics.median(ts), statistics.median(ta)
        rows.append((name, t_med, a_med))
        print(f"{name}: torch {t_med * 1e3:.2f} ms, attn {a_med * 1e3:.2f} ms, attn {t_med / a_med:.1f}x faster",
              flush=True)
    print()
    print(f"| case (Hk {a.hk}, Hv {a.hv}, D {a.d}, {a.threads} threads, {a.rounds} rounds) | torch | attn | "
          "torch / attn |")
    print("|---|---|---|---|")
    for name, t_med, a_med in rows:
        print(f"| {name} | {t_med * 1e3:.2f} ms | {a_med * 1e3:.2f} ms | {t_med / a_med:.1f} |")


if __name__ == "__main__":
    main()
