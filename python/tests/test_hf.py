"""A real client: Hugging Face ``transformers`` models built from tiny configs with random weights
(no download) run with ``attn_implementation="attn"`` against each model's reference
implementation (``"sdpa"``, or ``"eager"`` where ``sdpa`` cannot run the model: Gemma 2's
soft-capping, gpt-oss's learned sinks).

- The matrix (``MODELS``): decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, GPT-2,
  gpt-oss, DeepSeek-V3's MLA, the full-attention layers of Qwen3-Next and of Kimi Linear, an MLA
  without rotary positions) left-padded; encoders (BERT, RoBERTa, ModernBERT) right-padded;
  encoder-decoders (BART, T5 with its position bias, Whisper with audio features) right-padded
  on both sides. Eval and train mode: the logits on real tokens and the gradient of the loss
  with respect to every parameter. Each config also asserts what it is there to exercise (a
  sliding window shorter than the sequence, soft-capping, sinks, ``Dk != Dv``, cross attention,
  ...) on the calls attn received.
- Greedy ``generate`` from a left-padded batch for every decoder: the same tokens.
- ``output_attentions=True``: attn's weights against ``eager``'s, and the gradients of a loss
  that reads them.
- The attention function itself against ``sdpa_attention_forward``: a ``position_bias`` (with
  and without a mask, causal or not) and a paged cache.

Tolerance (the team's rule, per tensor): with the float64 reference model as the oracle,
``max|attn32 − ref64| ≤ k·max|ref32 − ref64| + floor``, k = 2 for logits and attention weights,
3 for gradients, ``floor = 1e-5·max|ref64|``."""

import copy
import dataclasses
from typing import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.generation.continuous_batching.cache import PagedAttentionCache  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask  # noqa: E402

import attn.hf  # noqa: E402

attn.hf.register()

VOCAB = 97
SEQ = 12  # tokens per sequence; encoder-decoders' decoders take DEC, so cross attention has Lq != Lk
DEC = 8
WINDOW = 5  # sliding windows, shorter than SEQ so that they mask keys a causal mask would keep


@dataclasses.dataclass
class Spec:
    """A model: its class and config, its inputs ("decoder": left padding; "encoder": right
    padding; "seq2seq": token ids for both sides; "speech": audio features for the encoder),
    ``exercises(model, calls)``, whether the model and the ``attn.sdpa`` calls it made show what
    the config is there to exercise, and its reference implementation."""

    cls: type
    cfg: object
    inputs: str
    exercises: Callable
    reference: str = "sdpa"


# Calls attn received (see ``recording``) and what they show.
def gqa(calls):
    return all(c["k"].shape[1] < c["q"].shape[1] for c in calls)


def windowed(c):
    """Whether the call's mask drops a key below the diagonal for the first (unpadded) sequence."""
    m = c["mask"]
    if m is None or m.shape[-2] != m.shape[-1]:
        return False
    keep = m[0, 0] if m.dtype == torch.bool else m[0, 0] > torch.finfo(m.dtype).min
    return bool((~keep).tril(-1).any())


def max_score(c):
    """The largest scaled score |q·k|·scale of the call."""
    k = c["k"].repeat_interleave(c["q"].shape[1] // c["k"].shape[1], 1)
    return (c["q"] @ k.transpose(-1, -2)).abs().max().item() * (c["scale"] or c["q"].shape[-1] ** -0.5)


def some_windowed(calls):
    """Sliding-window layers among full-attention ones."""
    return any(map(windowed, calls)) and not all(map(windowed, calls))


def bidirectional(calls):
    return all(not c["is_causal"] for c in calls) and all(c["mask"] is not None for c in calls)


def cross(calls, lk):
    """Cross-attention calls: DEC decoder queries over the encoder's ``lk`` positions."""
    return [c for c in calls if c["q"].shape[2] == DEC and c["k"].shape[2] == lk]


DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.0)


def llama():
    cfg = transformers.LlamaConfig(**DECODER)
    return Spec(transformers.LlamaForCausalLM, cfg, "decoder", lambda m, calls: gqa(calls))


def mistral():
    cfg = transformers.MistralConfig(**DECODER, sliding_window=WINDOW)
    return Spec(transformers.MistralForCausalLM, cfg, "decoder",
                lambda m, calls: m.config.sliding_window < SEQ and gqa(calls) and all(map(windowed, calls)))


def qwen2():
    cfg = transformers.Qwen2Config(**DECODER)
    return Spec(transformers.Qwen2ForCausalLM, cfg, "decoder",
                lambda m, calls: gqa(calls) and m.model.layers[0].self_attn.q_proj.bias is not None)


def qwen3():
    """A head dimension (24) other than hidden/heads (16), with its q/k norms."""
    cfg = transformers.Qwen3Config(**DECODER, head_dim=24)
    return Spec(transformers.Qwen3ForCausalLM, cfg, "decoder",
                lambda m, calls: gqa(calls) and all(c["q"].shape[-1] == 24 for c in calls))


def gemma2():
    """Soft-capped scores and alternating sliding/full layers; ``sdpa`` refuses soft-capping.
    Weights ten times the default's make scores reach twice the cap of 1, where tanh bends them."""
    cfg = transformers.Gemma2Config(**DECODER, head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=1.0,
                                    initializer_range=0.2)
    return Spec(
        transformers.Gemma2ForCausalLM, cfg, "decoder",
        lambda m, calls: all(c["softcap"] == 1.0 for c in calls) and max(map(max_score, calls)) > 2
        and some_windowed(calls), reference="eager",
    )


def gemma3():
    cfg = transformers.Gemma3TextConfig(**DECODER, head_dim=16, sliding_window=WINDOW,
                                        layer_types=["sliding_attention", "full_attention"])
    return Spec(transformers.Gemma3ForCausalLM, cfg, "decoder",
                lambda m, calls: all(c["softcap"] is None for c in calls) and some_windowed(calls))


def phi3():
    """Fused qkv projection; its default pad id (32000) lies outside the tiny vocabulary."""
    cfg = transformers.Phi3Config(**DECODER, pad_token_id=0, eos_token_id=2)
    return Spec(transformers.Phi3ForCausalLM, cfg, "decoder", lambda m, calls: gqa(calls))


def gpt2():
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=1, eos_token_id=2,
    )
    return Spec(transformers.GPT2LMHeadModel, cfg, "decoder", lambda m, calls: len(calls) == 2)


def gpt_oss():
    """Learned attention sinks (``s_aux``) and sliding-window layers; ``sdpa`` cannot run sinks,
    so the reference is ``eager`` (the experts too: the grouped matmul takes no float64)."""
    cfg = transformers.GptOssConfig(
        **dict(DECODER, intermediate_size=64), head_dim=16, num_local_experts=2, num_experts_per_tok=2,
        sliding_window=WINDOW, experts_implementation="eager",
    )
    return Spec(transformers.GptOssForCausalLM, cfg, "decoder",
                lambda m, calls: all(c["sinks"] is not None for c in calls) and some_windowed(calls),
                reference="eager")


def deepseek_v3():
    """Multi-head latent attention: query/key heads of 16 (8 without and 8 with rotary position),
    value heads of 12; a dense first layer, then a mixture of 4 experts with a shared one."""
    cfg = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=64, experts_implementation="eager",
    )

    def exercises(m, calls):
        mlps = [type(layer.mlp).__name__ for layer in m.model.layers]
        heads = {(c["q"].shape[-1], c["k"].shape[-1], c["v"].shape[-1]) for c in calls}
        return mlps == ["DeepseekV3MLP", "DeepseekV3MoE"] and heads == {(16, 16, 12)}

    return Spec(transformers.DeepseekV3ForCausalLM, cfg, "decoder", exercises)


def qwen3_next():
    """A linear-attention layer (transformers' PyTorch fallback) and a full-attention one (gated
    output, partial rotary), which alone reaches attn."""
    cfg = transformers.Qwen3NextConfig(
        **DECODER, head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, experts_implementation="eager",
    )
    return Spec(transformers.Qwen3NextForCausalLM, cfg, "decoder",
                lambda m, calls: len(calls) == 1 and gqa(calls) and "linear_attention" in m.config.layer_types)


def kimi_linear():
    """A Kimi Delta Attention layer (linear, transformers' PyTorch fallback) and a full-attention
    one, multi-head latent attention without rotary positions: query/key heads of 16, value heads
    of 12, which alone reaches attn; a dense first layer, then a mixture of 4 experts with a
    shared one. Its default pad id lies outside the tiny vocabulary."""
    cfg = transformers.KimiLinearConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, num_local_experts=4, num_experts_per_tok=2,
        kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12,
        layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"], linear_num_heads=2,
        linear_head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        experts_implementation="eager",
    )

    def exercises(m, calls):
        layers = [(type(layer.self_attn).__name__, type(layer.mlp).__name__) for layer in m.model.layers]
        heads = {(c["q"].shape[-1], c["k"].shape[-1], c["v"].shape[-1]) for c in calls}
        return (layers == [("KimiLinearDeltaAttention", "KimiLinearMLP"), ("KimiLinearAttention", "KimiLinearMoE")]
                and len(calls) == 1 and heads == {(16, 16, 12)})

    return Spec(transformers.KimiLinearForCausalLM, cfg, "decoder", exercises)


ENCODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def bert():
    cfg = transformers.BertConfig(**ENCODER)
    return Spec(transformers.BertForMaskedLM, cfg, "encoder", lambda m, calls: bidirectional(calls))


def roberta():
    """Position ids count from its padding id (1), which the random tokens avoid."""
    cfg = transformers.RobertaConfig(**ENCODER)
    return Spec(transformers.RobertaForMaskedLM, cfg, "encoder", lambda m, calls: bidirectional(calls))


def modernbert():
    """A global layer and a local one (a window of ±2 around each token)."""
    cfg = transformers.ModernBertConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, local_attention=4, layer_types=["full_attention", "sliding_attention"],
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
    )
    return Spec(transformers.ModernBertForMaskedLM, cfg, "encoder",
                lambda m, calls: bidirectional(calls) and some_windowed(calls))


def bart():
    cfg = transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0,
    )
    return Spec(transformers.BartForConditionalGeneration, cfg, "seq2seq",
                lambda m, calls: len(calls) == 6 and len(cross(calls, SEQ)) == 2)


def t5():
    """Relative position bias (learned, so differentiable) handed as ``position_bias``."""
    cfg = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        decoder_start_token_id=0,
    )
    return Spec(transformers.T5ForConditionalGeneration, cfg, "seq2seq",
                lambda m, calls: all(c["mask"].dtype.is_floating_point for c in calls) and len(cross(calls, SEQ)) == 2)


def whisper():
    """Audio features [B, mel bins, 2·source positions] through two convolutions (the second of
    stride 2) into 6 encoder positions, which the decoder's cross attention reads."""
    cfg = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, d_model=32, max_source_positions=6,
        max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        begin_suppress_tokens=None,
    )
    return Spec(transformers.WhisperForConditionalGeneration, cfg, "speech",
                lambda m, calls: len(calls) == 6 and len(cross(calls, 6)) == 2)


MODELS = {f.__name__: f for f in (
    llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, gpt2, gpt_oss, deepseek_v3, qwen3_next, kimi_linear,
    bert, roberta, modernbert, bart, t5, whisper,
)}
DECODERS = [name for name, f in MODELS.items() if f().inputs == "decoder"]


def padded(length, side, seed, pad_id):
    """Token ids [3, length] and their mask: the first sequence whole, the others padded on
    ``side`` by a third and by seven twelfths of ``length`` (pad positions hold ``pad_id``; the
    random tokens avoid the special ids 0-2)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, length), generator=g)
    mask = torch.ones(3, length, dtype=torch.long)
    for row, pad in ((1, length // 3), (2, length * 7 // 12)):
        if side == "left":
            mask[row, :pad] = 0
        else:
            mask[row, length - pad:] = 0
    return ids.masked_fill(mask == 0, pad_id), mask


def inputs(spec):
    """The model's keyword arguments (with labels on real tokens) and the mask of the positions
    whose logits count."""
    pad_id = spec.cfg.pad_token_id if spec.cfg.pad_token_id is not None else 0
    if spec.inputs in ("decoder", "encoder"):
        ids, mask = padded(SEQ, "left" if spec.inputs == "decoder" else "right", 0, pad_id)
        labels = ids.masked_fill(mask == 0, -100)
        if spec.inputs == "decoder":
            # A causal model predicts token t + 1 at t: no target for the last padding position,
            # whose query left padding leaves without a key (implementations differ there: eager
            # averages every value, sdpa and attn give 0).
            labels[:, 1:][mask[:, :-1] == 0] = -100
        return dict(input_ids=ids, attention_mask=mask, labels=labels), mask
    targets, target_mask = padded(DEC, "right", 1, pad_id)
    kwargs = dict(decoder_input_ids=targets, decoder_attention_mask=target_mask,
                  labels=targets.masked_fill(target_mask == 0, -100))
    if spec.inputs == "seq2seq":
        ids, mask = padded(SEQ, "right", 0, pad_id)
        kwargs.update(input_ids=ids, attention_mask=mask)
    else:
        g = torch.Generator().manual_seed(2)
        kwargs.update(input_features=torch.randn(3, spec.cfg.num_mel_bins, 2 * spec.cfg.max_source_positions,
                                                 generator=g))
    return kwargs, target_mask


def fresh(name):
    """The model's spec and a random state (seeded) for every implementation to load."""
    torch.manual_seed(0)
    spec = MODELS[name]()
    return spec, spec.cls._from_config(copy.deepcopy(spec.cfg)).state_dict()


def build(spec, implementation, dtype, state):
    # A config of its own: `_from_config` records the implementation on the config it is given.
    model = spec.cls._from_config(copy.deepcopy(spec.cfg), attn_implementation=implementation).to(dtype)
    model.load_state_dict(state)
    assert model.config._attn_implementation == implementation
    return model


def cast(kwargs, dtype):
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()}


def gradients(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def check(fast, naive32, ref64, k, what):
    fast, naive32, ref64 = fast.double(), naive32.double(), ref64.double()
    err, base = (fast - ref64).abs().max().item(), (naive32 - ref64).abs().max().item()
    floor = 1e-5 * ref64.abs().max().item()
    assert err <= k * base + floor, f"{what}: max|attn - ref64| = {err:.3e} > {k}·{base:.3e} + {floor:.1e}"


def check_gradients(grads):
    """attn's gradients against the reference's by the oracle rule, each of them non-zero."""
    ga, gs, g64 = grads
    assert ga.keys() == gs.keys() == g64.keys() and len(ga) > 10
    for p in ga:
        check(ga[p], gs[p], g64[p], 3, f"grad {p}")
        assert ga[p].abs().max() > 0, f"grad {p} is zero"


def eager_mask_of_finite_scores(*args, dtype=torch.float32, **kwargs):
    """``eager``'s mask, with float32's most negative number for masked scores whatever ``dtype``."""
    return eager_mask(*args, dtype=torch.float32, **kwargs).to(dtype)


@pytest.fixture(autouse=True)
def finite_eager_masks(monkeypatch):
    """The float64 ``eager`` oracle, as a mask, gives masked scores float32's most negative
    number, not float64's: the models' eager attention (Llama's, Gemma 2's, ...) takes its softmax
    in float32, where float64's would be ``-inf``, so that the rows left padding leaves without a
    key would be NaN, and, their values weighted by 0, make every token NaN after them. (float32
    models get the same mask as before.)"""
    monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS, "eager", eager_mask_of_finite_scores)


@pytest.fixture
def recording(monkeypatch):
    """The ``attn.sdpa`` calls of ``attn.hf`` (inputs, mask and options), as a list that fills."""
    calls, original = [], attn.hf.sdpa

    def record(q, k, v, **kw):
        calls.append(dict(kw, q=q.detach(), k=k.detach(), v=v.detach(), mask=kw["attn_mask"]))
        return original(q, k, v, **kw)

    monkeypatch.setattr(attn.hf, "sdpa", record)
    return calls


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", MODELS)
def test_logits_and_every_gradient_match_the_reference(name, mode, recording):
    spec, state = fresh(name)
    kwargs, real = inputs(spec)
    logits, grads = [], []
    for impl, dtype in (("attn", torch.float32), (spec.reference, torch.float32), (spec.reference, torch.float64)):
        model = build(spec, impl, dtype, state).train(mode == "train")
        recording.clear()
        out = model(**cast(kwargs, dtype))
        out.loss.backward()
        if impl == "attn":
            assert recording, "attn was not called"
            assert spec.exercises(model, list(recording)), f"{name} does not exercise what its config claims"
        logits.append(out.logits.detach()[real.bool()])
        grads.append(gradients(model))
    check(*logits, 2, "logits")
    check_gradients(grads)


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generation_matches_the_reference(name, recording):
    spec, state = fresh(name)
    kwargs, _ = inputs(spec)
    tokens = []
    for impl in ("attn", spec.reference):
        model = build(spec, impl, torch.float32, state).eval()
        with torch.no_grad():
            tokens.append(model.generate(
                input_ids=kwargs["input_ids"], attention_mask=kwargs["attention_mask"], max_new_tokens=6,
                min_new_tokens=6, do_sample=False, pad_token_id=0,
            ))
    assert tokens[0].shape == (3, SEQ + 6)
    # The prompt first, then one query at a time against the cache.
    assert recording[0]["q"].shape[2] == SEQ and all(c["q"].shape[2] == 1 for c in recording[-3:])
    assert torch.equal(*tokens), f"{tokens[0][:, SEQ:]} != {tokens[1][:, SEQ:]}"


@pytest.mark.parametrize("name", ["llama", "bert", "gemma2", "gpt_oss"])
def test_output_attentions_match_eager(name):
    """The weights on real query rows (left padding leaves the padding queries no key: eager
    spreads those rows uniformly, attn gives them no weight) and the gradients of a loss that
    reads them. gpt-oss's eager weights leave out the sink, so its rows sum to less than 1, as
    attn's do."""
    spec, state = fresh(name)
    kwargs, real = inputs(spec)
    rows = real.bool()[:, None, :, None]
    g = torch.Generator().manual_seed(3)
    probes = [torch.randn(3, 4, SEQ, SEQ, generator=g, dtype=torch.float64) * rows for _ in range(2)]
    weights, grads = [], []
    for impl, dtype in (("attn", torch.float32), ("eager", torch.float32), ("eager", torch.float64)):
        model = build(spec, impl, dtype, state).eval()
        out = model(**cast(kwargs, dtype), output_attentions=True)
        assert len(out.attentions) == 2
        (out.loss + sum((a * p.to(dtype)).sum() for a, p in zip(out.attentions, probes))).backward()
        sums = torch.stack(out.attentions).sum(-1).detach().transpose(2, 3)[:, real.bool()]
        assert (sums < 1 - 1e-3).all() if name == "gpt_oss" else torch.allclose(sums, torch.ones_like(sums))
        weights.append([a.detach().transpose(1, 2)[real.bool()] for a in out.attentions])
        grads.append(gradients(model))
    for layer, w in enumerate(zip(*weights)):
        check(*w, 2, f"attentions[{layer}]")
    check_gradients(grads)


def test_attentions_asked_for_in_the_config_are_returned():
    spec, state = fresh("llama")
    spec.cfg.output_attentions = True
    kwargs, _ = inputs(spec)
    out = build(spec, "attn", torch.float32, state)(**kwargs)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (3, 4, SEQ, SEQ)


def test_attn_implementation_runs_attn(recording):
    spec, state = fresh("llama")
    kwargs, _ = inputs(spec)
    build(spec, "attn", torch.float32, state)(**kwargs)
    assert len(recording) == spec.cfg.num_hidden_layers


class Module(torch.nn.Module):
    """What the attention functions read from the attention module: grouped-query attention
    with two query heads per key/value head."""

    def __init__(self, is_causal):
        super().__init__()
        self.is_causal, self.num_key_value_groups, self.layer_idx = is_causal, 2, 0


def attention_inputs(lq, lk, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, lq, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, lk, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, g


def assert_functions_agree(module, tensors, mask, options, names):
    """The attn attention function's output and input gradients are the sdpa one's, given q, k,
    v and other leaves in ``tensors`` (their ``names`` follow the output's), and
    ``options(leaves)``, the keyword arguments."""
    results = []
    for forward in (sdpa_attention_forward, attn.hf.attn_attention_forward):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        out, _ = forward(module, *leaves[:3], mask, **options(leaves))
        out.backward(torch.ones_like(out).cumsum(-1))
        results.append([out.detach(), *(t.grad for t in leaves)])
    for what, ref, got in zip(("out", *names), *results):
        torch.testing.assert_close(got, ref, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("lq, lk", [(5, 5), (3, 7), (1, 6)])
def test_a_position_bias_joins_the_scores_as_in_sdpa(lq, lk, causal, mask):
    """``position_bias`` [1, Hq, Lq, Lk], added to the scaled scores, combines with a bool mask
    (kept where True), a float mask (added) or, without one, the causal mask; its gradient too."""
    q, k, v, g = attention_inputs(lq, lk)
    bias = torch.randn(1, 4, lq, lk, generator=g, dtype=torch.float64)
    keep = torch.rand(2, 1, lq, lk, generator=g) > 0.3
    keep[..., 0] = True
    attention_mask = {
        None: None, "bool": keep,
        "float": torch.where(keep, torch.randn(keep.shape, generator=g, dtype=torch.float64), torch.finfo(q.dtype).min),
    }[mask]
    assert_functions_agree(Module(causal), (q, k, v, bias), attention_mask,
                           lambda leaves: dict(position_bias=leaves[3], scaling=0.3), ("dq", "dk", "dv", "dbias"))


def test_a_paged_cache_is_updated_before_attention_as_in_sdpa():
    """Continuous batching hands a ``PagedAttentionCache`` as ``cache``: its ``update`` returns
    the keys and values attention reads (here the new ones after a past of 4)."""
    class Paged(PagedAttentionCache):
        def __init__(self, past):
            self.past = past

        def update(self, key_states, value_states, layer_idx, kwargs):
            return tuple(torch.cat([p, new], 2) for p, new in zip(self.past, (key_states, value_states)))

    q, k, v, g = attention_inputs(3, 3)
    past = [torch.randn(2, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(2)]
    keep = torch.ones(3, 7, dtype=torch.bool).tril(4)[None, None]
    assert_functions_agree(Module(False), (q, k, v), keep, lambda leaves: dict(cache=Paged(past)), ("dq", "dk", "dv"))
