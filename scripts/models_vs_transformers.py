#!/usr/bin/env python3
"""The real models through attn against transformers on PyTorch, same weights (f32), same CPU,
same thread count, alternating rounds (transformers, attn, transformers, ...); the table shows
the median over rounds.

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

    def hf_generate():
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

    def attn_generate():
        out = subprocess.run([a.attn, "generate", "--model", smollm2, "--json", "--ignore-eos", "--threads",
                              str(a.threads), "--max-new-tokens", str(a.decode_len), prompt],
                             capture_output=True, text=True, check=True)
        j = json.loads(out.stdout)
        return j["prefill_tokens_per_s"], j["decode_tokens_per_s"]

    def hf_embed():
        t0 = time.perf_counter()
        with torch.no_grad():
            b = etok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = enc(**b).last_hidden_state
            m = b["attention_mask"].unsqueeze(-1).float()
            e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)
        assert e.shape[0] == len(sentences)
        return len(sentences) / (time.perf_counter() - t0)

    def attn_embed():
        out = subprocess.run([a.attn, "embed", "--model", minilm_dir, "--threads", str(a.threads), "--json", *sentences],
                             capture_output=True, text=True, check=True)
        return float(re.search(r"\(([\d.]+) texts/s", out.stderr).group(1))

    hf_embed(), hf_generate()  # warm-up
    rows = {k: ([], []) for k in ("prefill", "decode", "embed")}
    for r in range(a.rounds):
        hp, hd = hf_generate()
        ap, ad = attn_generate()
        he, ae = hf_embed(), attn_embed()
        for k, h, at in (("prefill", hp, ap), ("decode", hd, ad), ("embed", he, ae)):
            rows[k][0].append(h)
            rows[k][1].append(at)
        print(f"round {r + 1}: prefill {hp:.0f} vs {ap:.0f} tok/s, decode {hd:.1f} vs {ad:.1f} tok/s, "
              f"embed {he:.0f} vs {ae:.0f} texts/s", flush=True)
    print(f"\n{a.rounds} alternating rounds, {a.threads} threads, torch {torch.__version__}")
    print(f"{'what':<40} {'transformers':>12} {'attn':>10} {'ratio':>7}")
    labels = {"prefill": f"SmolLM2 prefill {len(ids)} tokens (tok/s)",
              "decode": f"SmolLM2 decode {a.decode_len} after {len(ids)} (tok/s)",
              "embed": f"MiniLM embed {a.sentences} sentences (texts/s)"}
    for k, (h, at) in rows.items():
        mh, ma = statistics.median(h), statistics.median(at)
        print(f"{labels[k]:<40} {mh:>12.1f} {ma:>10.1f} {ma / mh:>6.2f}x")


if __name__ == "__main__":
    main()
