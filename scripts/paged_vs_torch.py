#!/usr/bin/env python3
"""Compare decoding from attn's paged KV cache (``attn.flash_attn_with_kvcache`` with a
``block_table``: every sequence in one call of the paged kernel) with PyTorch's SDPA decoding each
sequence from a padded dense bfloat16 cache (``F.scaled_dot_product_attention`` on the sequence's
filled part, ``enable_gqa=True``). 16 sequences with contexts drawn uniformly from 1K–8K tokens,
GQA 32/8, D 128, one new query each, pages of 16 (each sequence's pages interleaved with the
others', as sequences decoding side by side get them). Same process, same inputs, the same thread
count for both; timed in alternating rounds (torch, attn, ...), each round the median of
``--reps`` calls, the table the median over rounds. The outputs are checked against each other
first.

Setup:  scripts/ci_python.sh --prepare (or pip install torch), and the package built
        (pip install ./python, or PYTHONPATH at a staged package)
Usage:  python scripts/paged_vs_torch.py [--threads 2] [--rounds 5] [--reps 3] [--batch 16]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


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
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()

    import attn

    torch.set_num_threads(a.threads)
    attn.set_num_threads(a.threads)
    b, hq, hkv, d, page, longest = a.batch, 32, 8, 128, 16, 8192
    gen = torch.Generator().manual_seed(0)
    lens = (1024 + torch.rand(b, generator=gen) * 7168).long().tolist()
    pages_of = [-(-n // page) for n in lens]
    table = torch.zeros(b, longest // page, dtype=torch.int32)
    nxt = 0
    for p in range(longest // page):
        for s in range(b):
            if p < pages_of[s]:
                table[s, p] = nxt
                nxt += 1
    dense = {
        name: torch.zeros(b, hkv, longest, d, dtype=torch.bfloat16) for name in ("k", "v")
    }
    pages = {}
    for name in ("k", "v"):
        x = torch.randn(nxt, page, hkv, d, generator=gen).to(torch.bfloat16)
        pages[name] = x
        for s in range(b):
            rows = x[table[s, :pages_of[s]].long()].reshape(-1, hkv, d)[:lens[s]]
            dense[name][s, :, :lens[s]] = rows.transpose(0, 1)
    q = torch.randn(b, 1, hq, d, generator=gen)
    qb = q.to(torch.bfloat16).transpose(1, 2)
    seqlens = torch.tensor(lens, dtype=torch.int32)

    def run_attn(kind):
        k_pages, v_pages = (pages["k"], pages["v"]) if kind == "bf16" else (pages_f32["k"], pages_f32["v"])
        return attn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table)

    def run_torch():
        return [F.scaled_dot_product_attention(qb[s:s + 1], dense["k"][s:s + 1, :, :lens[s]],
                                               dense["v"][s:s + 1, :, :lens[s]], enable_gqa=True)
                for s in range(b)]

    pages_f32 = {name: x.float() for name, x in pages.items()}
    ours = run_attn("bf16")
    theirs = torch.cat(run_torch()).transpose(1, 2).float()
    err = (ours - theirs).abs().max().item()
    assert err < 2e-2, f"attn and torch differ by {err}"
    results = {"torch": [], "attn_bf16": [], "attn_f32": []}
    for _ in range(a.rounds):
        results["torch"].append(timed(run_torch, a.reps))
        results["attn_bf16"].append(timed(lambda: run_attn("bf16"), a.reps))
        results["attn_f32"].append(timed(lambda: run_attn("f32"), a.reps))
    tokens = sum(lens)
    print(f"decode, {b} sequences, contexts 1K-8K ({tokens} cached tokens), GQA {hq}/{hkv}, D {d}, "
          f"{a.threads} threads, {a.rounds} rounds x {a.reps} reps (max |attn - torch| {err:.1e})")
    t = statistics.median(results["torch"])
    print(f"{'':28} {'ms':>8} {'GiB/s read':>11} {'torch / this':>13}")
    for name, bytes_per in (("torch", 2), ("attn_bf16", 2), ("attn_f32", 4)):
        m = statistics.median(results[name])
        read = 2 * tokens * hkv * d * bytes_per / m / 2**30
        print(f"{name:28} {1e3 * m:8.2f} {read:11.1f} {t / m:13.2f}")


if __name__ == "__main__":
    main()
