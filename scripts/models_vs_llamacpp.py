#!/usr/bin/env python3
"""SmolLM2-135M's GGUF (Q4_1) through llama.cpp (llama-cpp-python, its own quantized matmuls) and
through `attn generate --weights W`, same file, same prompt, same CPU, same thread count,
alternating rounds (each side once per round, in turn); the table shows the median over rounds.

- prefill: tokens/s of one forward over --prompt-len tokens of --text (llama.cpp's tokenizer;
  attn gets the same text back and reports its own count, equal for this model);
- decode: tokens/s of --decode-len greedy tokens after it (the first new token, which comes out
  of the prefill, not counted), the KV cache on both sides.

attn's times are what `attn generate --json` reports for the work itself, llama.cpp's are
`Llama.eval` timed around the calls (model loading excluded on both sides).

Setup:  pip install llama-cpp-python (builds llama.cpp from the PyPI sdist with the machine's
        compiler and CMake from PyPI; its own build flags, native CPU features included), and
        cargo build --release -p attn-cli; target/release/attn models fetch smollm2
Usage:  python scripts/models_vs_llamacpp.py --attn target/release/attn [--threads 2] [--rounds 3]
        [--weights int8 bf16 f32]
"""
import argparse
import json
import re
import statistics
import subprocess
import time

import numpy as np
from llama_cpp import Llama


def smollm2_path(attn):
    out = subprocess.run([attn, "models", "list"], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^(\w+)\s+fetched.*\n\s+(\S+)", out, re.M))["smollm2"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", default="target/release/attn")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--decode-len", type=int, default=64)
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--weights", nargs="+", default=["int8"], choices=["f32", "bf16", "int8"], help="attn's --weights")
    a = p.parse_args()
    gguf = smollm2_path(a.attn)
    llm = Llama(model_path=gguf, n_ctx=a.prompt_len + a.decode_len + 8, n_batch=a.prompt_len, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False)
    ids = llm.tokenize(open(a.text, "rb").read(), add_bos=False)[: a.prompt_len]
    prompt = llm.detokenize(ids).decode()

    def argmax_last():
        # Without logits_all, llama.cpp computes the last position's logits only (as attn does).
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))))

    def llama_generate():
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        nxt = argmax_last()
        t1 = time.perf_counter()
        for _ in range(a.decode_len - 1):
            llm.eval([nxt])
            nxt = argmax_last()
        t2 = time.perf_counter()
        return len(ids) / (t1 - t0), (a.decode_len - 1) / (t2 - t1)

    def attn_generate(weights):
        out = subprocess.run([a.attn, "generate", "--model", gguf, "--json", "--ignore-eos", "--threads", str(a.threads),
                              "--weights", weights, "--max-new-tokens", str(a.decode_len), prompt],
                             capture_output=True, text=True, check=True)
        j = json.loads(out.stdout)
        if len(j["prompt_ids"]) != len(ids):
            raise SystemExit(f"attn's prompt has {len(j['prompt_ids'])} tokens, llama.cpp's {len(ids)}")
        return j["prefill_tokens_per_s"], j["decode_tokens_per_s"]

    sides = {"llama.cpp Q4_1": llama_generate}
    sides.update({f"attn {w}": (lambda w=w: attn_generate(w)) for w in a.weights})
    llama_generate()  # warm-up
    rows = {name: {"prefill": [], "decode": []} for name in sides}
    for r in range(a.rounds):
        shown = []
        for name, run in sides.items():
            pre, dec = run()
            rows[name]["prefill"].append(pre)
            rows[name]["decode"].append(dec)
            shown.append(f"{name}: {pre:.0f} / {dec:.1f} tok/s")
        print(f"round {r + 1}: " + "; ".join(shown), flush=True)
    print(f"\n{a.rounds} alternating rounds, {a.threads} threads; medians, and in brackets against llama.cpp")
    print(f"{'what':<36} " + " ".join(f"{name:>20}" for name in sides))
    for k, label in {"prefill": f"prefill {len(ids)} tokens (tok/s)",
                     "decode": f"decode {a.decode_len} after {len(ids)} (tok/s)"}.items():
        base = statistics.median(rows["llama.cpp Q4_1"][k])
        cells = [f"{statistics.median(rows[n][k]):.1f} ({statistics.median(rows[n][k]) / base:.2f}x)" for n in sides]
        print(f"{label:<36} " + " ".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
