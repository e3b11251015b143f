"""A real client: Hugging Face ``transformers`` models built from configs with random weights (no
download), with ``attn_implementation="attn"`` against ``"sdpa"`` (``"eager"`` for gpt-oss, whose learned
attention sinks ``sdpa`` cannot run). Padding masks (left for the
decoders, right for BERT) and causal masks; logits and the gradient of the loss with respect to
every parameter.

Tolerance (the team's rule, per tensor): with the float64 reference model as the oracle,
``max|attn32 − ref64| ≤ k·max|ref32 − ref64| + floor``, k = 2 for logits and 3 for gradients,
``floor = 1e-5·max|ref64|``; logits compared on real (non-padding) tokens."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn.hf  # noqa: E402

attn.hf.register()

SEQ = 12


def llama():
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0,
    )
    return transformers.LlamaForCausalLM, cfg, "left"


def gpt2():
    cfg = transformers.GPT2Config(
        vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel, cfg, "left"


def bert():
    cfg = transformers.BertConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM, cfg, "right"


def gpt_oss():
    """Learned attention sinks (``s_aux``) and sliding-window layers; PyTorch's ``sdpa`` cannot run
    it, so its reference is ``eager`` (the experts too: the grouped matmul takes no float64)."""
    cfg = transformers.GptOssConfig(
        vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=2, max_position_embeddings=64,
        sliding_window=5, attention_dropout=0.0, experts_implementation="eager",
    )
    return transformers.GptOssForCausalLM, cfg, "left"


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert, "gpt_oss": gpt_oss}
# The implementation each model is compared with.
REFERENCE = {"gpt_oss": "eager"}


def batch(side):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 97, (3, SEQ), generator=g)
    mask = torch.ones(3, SEQ, dtype=torch.long)
    for row, pad in ((1, 4), (2, 7)):
        if side == "left":
            mask[row, :pad] = 0
        else:
            mask[row, SEQ - pad:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids, mask, labels


def run(model, ids, mask, labels):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), grads


def build(name, implementation, dtype, state):
    cls, cfg, _ = MODELS[name]()
    model = cls._from_config(copy.deepcopy(cfg), attn_implementation=implementation).to(dtype)
    model.load_state_dict(state)
    return model


def check(fast, naive32, ref64, k, what):
    fast, naive32, ref64 = fast.double(), naive32.double(), ref64.double()
    err, base = (fast - ref64).abs().max().item(), (naive32 - ref64).abs().max().item()
    floor = 1e-5 * ref64.abs().max().item()
    assert err <= k * base + floor, f"{what}: max|attn - ref64| = {err:.3e} > {k}·{base:.3e} + {floor:.1e}"


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_and_every_gradient_match_the_reference(name, mode):
    torch.manual_seed(0)
    cls, cfg, side = MODELS[name]()
    state = cls._from_config(cfg).state_dict()
    ids, mask, labels = batch(side)
    results = {}
    ref = REFERENCE.get(name, "sdpa")
    for impl, dtype in (("attn", torch.float32), (ref, torch.float32), (ref, torch.float64)):
        model = build(name, impl, dtype, state)
        assert model.config._attn_implementation == impl
        model.train(mode == "train")
        results[impl, dtype] = run(model, ids, mask, labels)
    (la, ga), (ls, gs), (l64, g64) = results.values()
    real = mask.bool()
    check(la[real], ls[real], l64[real], 2, "logits")
    assert ga.keys() == gs.keys() == g64.keys() and len(ga) > 10
    for p in ga:
        check(ga[p], gs[p], g64[p], 3, f"grad {p}")
        assert ga[p].abs().max() > 0, f"grad {p} is zero"


def test_attn_implementation_runs_attn():
    calls = []
    original = attn.hf.sdpa
    attn.hf.sdpa = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    try:
        cls, cfg, side = llama()
        model = cls._from_config(cfg, attn_implementation="attn")
        ids, mask, _ = batch(side)
        model(input_ids=ids, attention_mask=mask)
    finally:
        attn.hf.sdpa = original
    assert len(calls) == cfg.num_hidden_layers



def test_a_position_bias_is_refused_not_ignored():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="position_bias"):
        attn.hf.attn_attention_forward(None, q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))
