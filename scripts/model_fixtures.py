#!/usr/bin/env python3
"""Golden outputs of the real models (issue 48) from transformers, for crates/attn-models' tests.

The float64 model is the oracle; the float32 one measures the error an f32 implementation makes
(the oracle rule's `naive32`). Token ids come from transformers' own tokenizers (for the GGUFs,
the ones it builds from the file's metadata). Writes small JSON files; the weights stay outside.

    attn models fetch minilm smollm2 gemma3     # prints the model paths
    PY=<venv with torch, transformers, gguf, accelerate>
    $PY scripts/model_fixtures.py --minilm DIR --smollm2 FILE.gguf --gemma3 FILE.gguf \
        --out crates/attn-models/tests/fixtures
"""
import argparse
import json
import math
import os

import torch

torch.manual_seed(0)
torch.set_num_threads(2)

MINILM_TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "Attention is all you need: softmax(QK^T / sqrt(d_k)) V.",
    "注意力机制是 Transformer 的核心。",
    "Héllo   wörld!! 12345 tabs\tand\nnewlines",
    "short",
]

TOKENIZER_TEXTS = [
    "What is the capital of France?",
    "Hello world",
    " leading space and  two   runs    of spaces",
    "tabs\tand\nnewlines\n\n\nand\r\ncrlf",
    "digits 0 12 345 6789 3.14159 1,000,000",
    "unicode: café naïve 日本語 中文 emoji 🙂👍🏽 Ünïcödé",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "it's they're we'll I'd don't",
    "",
]


HEADS_TEXT = "The cat sat on the mat because the mat was warm, and the cat was tired."


def head_scores(model, text_ids, repeat_len=50, seed=0):
    """Sink, previous-token and induction scores per [layer][head] from transformers'
    `output_attentions` (eager attention), on the text and on `repeat_len` random ids in
    [1000, 10000) repeated twice; with the error of the float32 model against the float64 one."""
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(1000, 10000, (repeat_len,), generator=g).tolist()
    repeated = first + first
    r = repeat_len

    def scores(m):
        with torch.no_grad():
            text = m(input_ids=torch.tensor([text_ids]), output_attentions=True).attentions
            rep = m(input_ids=torch.tensor([repeated]), output_attentions=True).attentions
        sink = [a[0, :, 1:, 0].mean(-1).tolist() for a in text]
        prev = [torch.diagonal(a[0], offset=-1, dim1=-2, dim2=-1).mean(-1).tolist() for a in text]
        ind = [torch.stack([a[0, :, i, i - r + 1] for i in range(r, 2 * r)], -1).mean(-1).tolist() for a in rep]
        return {"sink": sink, "previous": prev, "induction": ind}

    return repeated, scores


def heads_fixture(m32, m64, text_ids):
    repeated, scores = head_scores(m64, text_ids)
    s64, s32 = scores(m64), scores(m32)
    err32 = max(abs(a - b) for k in s64 for r64, r32 in zip(s64[k], s32[k]) for a, b in zip(r64, r32))
    return {"text": HEADS_TEXT, "text_ids": text_ids, "induction_ids": repeated, **s64, "err32": err32}


def write(out, name, obj):
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def rounded(t, digits=10):
    """A float64 tensor's values with `digits` significant digits (the files stay small; far below
    any tolerance the tests use)."""
    return [[float(f"{x:.{digits}g}") for x in row] for row in t.tolist()]


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item()


def minilm(model_dir, out):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    batch = tok(MINILM_TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    ids = [row[: int(m.sum())].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]

    def embed(dtype):
        model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").to(dtype).eval()
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1), hidden, mask

    e64, h64, mask = embed(torch.float64)
    e32, h32, _ = embed(torch.float32)
    m64 = AutoModel.from_pretrained(model_dir, attn_implementation="eager").to(torch.float64).eval()
    m32 = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    heads = heads_fixture(m32, m64, tok(HEADS_TEXT).input_ids)
    write(out, "minilm.json", {
        "heads": heads,
        "texts": MINILM_TEXTS,
        "ids": ids,
        "embeddings": rounded(e64),
        "err32_embeddings": max_abs(e32, e64),
        "err32_hidden": max_abs(h32 * mask, h64 * mask),
    })


def greedy(model, prompt_ids, new_tokens):
    """Greedy ids and, per step, the gap between the top two logits of the model."""
    ids = torch.tensor([prompt_ids])
    out, gaps = [], []
    past = None
    with torch.no_grad():
        for _ in range(new_tokens):
            r = model(input_ids=ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True,
                      logits_to_keep=1)
            past = r.past_key_values
            logits = r.logits[0, -1]
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out, gaps


def decoder(gguf, out, text_file, name, chat, prompts, long_len):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m32 = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation="eager").eval()
    m64 = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, attn_implementation="eager").to(torch.float64).eval()

    tokenizer = [{"text": t, "ids": tok(t).input_ids} for t in TOKENIZER_TEXTS]
    chat_messages = ["What is the capital of France?", "Write a haiku about attention."] if chat else []
    chats = []
    for msg in chat_messages:
        text = tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=False, add_generation_prompt=True)
        chats.append({"message": msg, "text": text, "ids": tok(text).input_ids})

    with open(text_file) as fh:
        corpus = fh.read()
    corpus_ids = tok(corpus).input_ids
    long_prompt = corpus_ids[:long_len]

    if chat:
        runs = [("chat", chats[0]["ids"], 16), ("haiku", chats[1]["ids"], 24)]
    else:
        runs = [(f"prompt{i}", tok(p).input_ids, 16) for i, p in enumerate(prompts)]
    runs.append(("long", long_prompt, 24))
    generations = []
    for run, prompt, n in runs:
        ids, gaps = greedy(m64, prompt, n)
        generations.append({"name": run, "prompt_ids": prompt, "ids": ids, "gaps": gaps})

    # Prefill logits of the first prompt at every position, on every 389th vocabulary entry.
    prompt = torch.tensor([generations[0]["prompt_ids"]])
    with torch.no_grad():
        l64 = m64(input_ids=prompt).logits[0]
        l32 = m32(input_ids=prompt).logits[0]
    stride = 389
    cols = list(range(0, l64.shape[1], stride))

    # Perplexity of the corpus' first 256 tokens in one causal pass: the mean negative
    # log-likelihood of tokens 1..n-1 given those before (transformers' `labels=` loss, but in the
    # model's dtype: that loss upcasts to float32 only).
    n = 256
    ppl_ids = torch.tensor([corpus_ids[:n]])

    def nll(model):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ppl_ids).logits[0, :-1], dim=-1)
        return -logp.gather(1, ppl_ids[0, 1:, None]).mean().item()

    nll64, nll32 = nll(m64), nll(m32)

    heads = heads_fixture(m32, m64, tok(HEADS_TEXT).input_ids)
    write(out, f"{name}.json", {
        "heads": heads,
        "tokenizer": tokenizer,
        "chats": chats,
        "generations": generations,
        "prefill": {"ids": generations[0]["prompt_ids"], "stride": stride, "logits": rounded(l64[:, cols]),
                    "err32": max_abs(l32, l64)},
        "perplexity": {"text": os.path.basename(text_file), "tokens": n, "nll": nll64, "ppl": math.exp(nll64),
                       "nll32": nll32},
    })


def tiny_decoders(out):
    """Tiny random Llama, Qwen2 (q/k/v biases) and Mistral (a 4-key sliding window) models saved
    in Hugging Face's layout (config.json + model.safetensors, no tokenizer), with their float64
    logits on a 12-token sequence: attn's loading of the Llama family by Hugging Face names. Weights
    drawn with std 0.3 (not the 0.02 of training) so the attention is far from uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0,
                  tie_word_embeddings=False, initializer_range=0.3)
    models = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
        "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": 4}),
    }
    ids = [1, 5, 9, 2, 47, 30, 11, 11, 3, 20, 8, 40]
    for name, (cfg_cls, model_cls, extra) in models.items():
        torch.manual_seed(len(name))
        cfg = cfg_cls(**common, **extra, attn_implementation="eager")
        m32 = model_cls(cfg).eval()
        d = os.path.join(out, f"tiny-{name}")
        m32.save_pretrained(d, safe_serialization=True)
        for extra_file in ("generation_config.json",):
            if os.path.exists(os.path.join(d, extra_file)):
                os.remove(os.path.join(d, extra_file))
        m64 = model_cls.from_pretrained(d, attn_implementation="eager").to(torch.float64).eval()
        with torch.no_grad():
            l64 = m64(input_ids=torch.tensor([ids])).logits[0]
            l32 = m32(input_ids=torch.tensor([ids])).logits[0]
        write(d, "logits.json", {"ids": ids, "logits": rounded(l64), "err32": max_abs(l32, l64)})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minilm")
    p.add_argument("--smollm2")
    p.add_argument("--gemma3")
    p.add_argument("--tiny", action="store_true", help="the tiny random Hugging Face decoders")
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--out", default="crates/attn-models/tests/fixtures")
    a = p.parse_args()
    if a.minilm:
        minilm(a.minilm, a.out)
    if a.smollm2:
        decoder(a.smollm2, a.out, a.text, "smollm2", chat=True, prompts=[], long_len=300)
    if a.tiny:
        tiny_decoders(a.out)
    if a.gemma3:
        # The long prompt (over 600 tokens) makes the 512-key sliding window bite.
        decoder(a.gemma3, a.out, a.text, "gemma3", chat=False,
                prompts=["The capital of France is", "def fibonacci(n):"], long_len=650)


if __name__ == "__main__":
    main()
