#!/usr/bin/env python3
"""The real models through attn against transformers on PyTorch, same weights, same CPU, same
thread count, alternating rounds (each side once per round, in turn); the table shows the median
over rounds and each side against transformers in f32.

Sides: transformers with the weights in f32, and with --torch-bf16 the same model cast to
bfloat16 (`model.to(torch.bfloat16)`: every product and activation in bf16); attn with each of
--weights (f32: the parity mode; bf16: the linear layers' weights and inputs rounded to bfloat16,
sums, norms, attention and the residual stream in f32; int8: the weights kept as 8-bit
blocks of 32, multiplied unrounded, inputs rounded to bfloat16).

- SmolLM2 prefill: tokens/s of one forward over a prompt of --prompt-len tokens (GPL-3's text),
  the last position's logits only on both sides (what generation needs);
- SmolLM2 decode: tokens/s of --decode-len greedy tokens after that prompt (the first new token,
  which comes out of the prefill, not counted), KV cache on both sides;
- MiniLM: texts/s embedding --sentences sentences as one padded batch (tokenizing, the encoder,
  mean pooling and normalising).

attn's times are what `attn generate --json` / `attn embed` report for the work itself (the
process start and the weights' loading excluded, as transformers' are).

Setup:  a Python with torch, transformers, gguf (scripts/model_fixtures.py's), and
        cargo build --release -p attn-cli; target/release/attn models fetch minilm smollm2
Usage:  python scripts/models_vs_transformers.py --attn target/release/attn [--threads 2] [--rounds 5]
        [--weights f32 bf16 int8] [--torch-bf16]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time

import torch

MINILM_SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
]


def paths(attn):
    out = subprocess.run([attn, "models", "list"], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"^(\w+)\s+fetched.*\n\s+(\S+)", out, re.M))
    return found["minilm"], found["smollm2"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", default="target/release/attn")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--decode-len", type=int, default=64)
    p.add_argument("--sentences", type=int, default=64)
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--weights", nargs="+", default=["f32"], choices=["f32", "bf16", "int8"], help="attn's --weights")
    p.add_argument("--torch-bf16", action="store_true", help="also transformers with the model in bfloat16")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    minilm_dir, smollm2 = paths(a.attn)
    d, f = os.path.split(smollm2)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    lm = AutoModelForCausalLM.from_pretrained(d, gguf_file=f).eval()
    ids = tok(open(a.text).read()).input_ids[: a.prompt_len]
    prompt = tok.decode(ids)
    etok = AutoTokenizer.from_pretrained(minilm_dir)
    enc = AutoModel.from_pretrained(minilm_dir).eval()
    sentences = [MINILM_SENTENCES[i % len(MINILM_SENTENCES)] + f" ({i})" for i in range(a.sentences)]

    lms = {"f32": lm}
    encs = {"f32": enc}
    if a.torch_bf16:
        lms["bf16"] = AutoModelForCausalLM.from_pretrained(d, gguf_file=f).eval().to(torch.bfloat16)
        encs["bf16"] = AutoModel.from_pretrained(minilm_dir).eval().to(torch.bfloat16)

    def hf_generate(lm):
        with torch.no_grad():
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            r = lm(input_ids=x, use_cache=True, logits_to_keep=1)
            nxt = r.logits[0, -1].argmax().view(1, 1)
            t1 = time.perf_counter()
            past = r.past_key_values
            for _ in range(a.decode_len - 1):
                r = lm(input_ids=nxt, past_key_values=past, use_cache=True, logits_to_keep=1)
                past, nxt = r.past_key_values, r.logits[0, -1].argmax().view(1, 1)
            t2 = time.perf_counter()
        return len(ids) / (t1 - t0), (a.decode_len - 1) / (t2 - t1)

    def attn_generate(weights):
        out = subprocess.run([a.attn, "generate", "--model", smollm2, "--json", "--ignore-eos", "--threads",
                              str(a.threads), "--weights", weights, "--max-new-tokens", str(a.decode_len), prompt],
                             capture_output=True, text=True, check=True)
        j = json.loads(out.stdout)
        return j["prefill_tokens_per_s"], j["decode_tokens_per_s"]

    def hf_embed(enc):
        t0 = time.perf_counter()
        with torch.no_grad():
            b = etok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = enc(**b).last_hidden_state.float()
            m = b["attention_mask"].unsqueeze(-1).float()
            e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)
        assert e.shape[0] == len(sentences)
        return len(sentences) / (time.perf_counter() - t0)

    def attn_embed(weights):
        out = subprocess.run([a.attn, "embed", "--model", minilm_dir, "--threads", str(a.threads), "--weights", weights,
                              "--json", *sentences], capture_output=True, text=True, check=True)
        return float(re.search(r"\(([\d.]+) texts/s", out.stderr).group(1))

    sides = {f"transformers {w}": (lambda w=w: (*hf_generate(lms[w]), hf_embed(encs[w]))) for w in lms}
    sides.update({f"attn {w}": (lambda w=w: (*attn_generate(w), attn_embed(w))) for w in a.weights})
    for w in lms:  # warm-up
        hf_embed(encs[w]), hf_generate(lms[w])
    rows = {name: {"prefill": [], "decode": [], "embed": []} for name in sides}
    for r in range(a.rounds):
        shown = []
        for name, run in sides.items():
            for k, v in zip(("prefill", "decode", "embed"), run()):
                rows[name][k].append(v)
            shown.append(f"{name}: {rows[name]['prefill'][-1]:.0f} / {rows[name]['decode'][-1]:.1f} tok/s, "
                         f"{rows[name]['embed'][-1]:.0f} texts/s")
        print(f"round {r + 1}: " + "; ".join(shown), flush=True)
    print(f"\n{a.rounds} alternating rounds, {a.threads} threads, torch {torch.__version__}; medians, "
          "and in brackets against transformers f32")
    labels = {"prefill": f"SmolLM2 prefill {len(ids)} tokens (tok/s)",
              "decode": f"SmolLM2 decode {a.decode_len} after {len(ids)} (tok/s)",
              "embed": f"MiniLM embed {a.sentences} sentences (texts/s)"}
    print(f"{'what':<40} " + " ".join(f"{name:>22}" for name in sides))
    for k, label in labels.items():
        base = statistics.median(rows["transformers f32"][k])
        cells = [f"{statistics.median(rows[n][k]):.1f} ({statistics.median(rows[n][k]) / base:.2f}x)" for n in sides]
        print(f"{label:<40} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
