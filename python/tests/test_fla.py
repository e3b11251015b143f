"""``attn.fla``: the gated delta rule in fla's names, and the hybrid models of ``transformers`` that
call them.

- The four functions against ``transformers``' own PyTorch fallbacks (``__wrapped__``: the
  functions before ``use_kernel_func_from_hub_with_fallback``) and against attn's float64
  recurrence, outputs, final states and every gradient by the oracle rule; float64 gradients by
  ``torch.autograd.gradcheck``; packed sequences (``cu_seqlens``, which the fallbacks refuse) equal
  to separate calls; bad input refused naming the argument.
- Real clients: Qwen3-Next, Qwen3.5, OLMo-hybrid and Kimi Linear from tiny configs with random
  weights (no download), left-padded, eval and train mode: the logits on real tokens and the
  gradient of the loss with respect to every parameter, attn's kernels (``attn.hf.register()``)
  against the models' PyTorch fallbacks (``attn.hf.restore_delta_rule()``), with the float64
  model on attn's float64 recurrence as the oracle; a greedy ``generate`` of 16 tokens with the
  recurrent cache gives the fallbacks' tokens.

Tolerance: ``max|attn32 − ref64| ≤ k·max|fallback32 − ref64| + floor``, k = 2 for outputs, 3 for
gradients; and the fallback itself within ``1e-3·max|ref64|`` of the oracle (so the rule pins the
fallbacks' semantics rather than excusing a different rule)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attn.fla as fla  # noqa: E402
import attn.hf  # noqa: E402
from transformers.models.kimi_linear import modeling_kimi_linear as kimi  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next  # noqa: E402

FALLBACKS = {
    "chunk_gated_delta_rule": qwen3_next.torch_chunk_gated_delta_rule.__wrapped__,
    "fused_recurrent_gated_delta_rule": qwen3_next.torch_recurrent_gated_delta_rule.__wrapped__,
    "chunk_kda": kimi.chunk_kimi_delta_attention.__wrapped__,
    "fused_recurrent_kda": kimi.recurrent_kimi_delta_attention.__wrapped__,
}


def check(fast, naive32, ref64, k, what):
    fast, naive32, ref64 = fast.double(), naive32.double(), ref64.double()
    err, base = (fast - ref64).abs().max().item(), (naive32 - ref64).abs().max().item()
    scale = ref64.abs().max().item()
    assert base <= 1e-3 * scale + 1e-6, f"{what}: the fallback is {base:.3e} from the oracle (max {scale:.3e})"
    floor = 1e-5 * scale
    assert err <= k * base + floor, f"{what}: max|attn - ref64| = {err:.3e} > {k}·{base:.3e} + {floor:.1e}"


def rule_inputs(channel, b=2, t=70, hk=2, hv=4, dk=16, dv=8, seed=0):
    """q, k, v, g, beta, initial_state in float64 (Kimi's layout has as many key as value heads)."""
    gen = torch.Generator().manual_seed(seed)
    if channel:
        hk = hv
    q = torch.randn(b, t, hk, dk, generator=gen, dtype=torch.float64)
    k = torch.randn(b, t, hk, dk, generator=gen, dtype=torch.float64)
    v = torch.randn(b, t, hv, dv, generator=gen, dtype=torch.float64)
    g = -torch.rand(*((b, t, hv, dk) if channel else (b, t, hv)), generator=gen, dtype=torch.float64)
    beta = torch.rand(b, t, hv, generator=gen, dtype=torch.float64)
    s0 = torch.randn(b, hv, dk, dv, generator=gen, dtype=torch.float64)
    return [q, k, v, g, beta, s0]


def run(fn, tensors, dtype):
    """Output, final state and the gradients of a loss on both, for ``fn`` on ``tensors`` in ``dtype``."""
    args = [x.detach().to(dtype).requires_grad_() for x in tensors]
    q, k, v, g, beta, s0 = args
    o, final = fn(q, k, v, g=g, beta=beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    weights = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape)
    (o.double() * weights).sum().add(final.double().square().sum()).backward()
    return [o.detach(), final.detach()] + [a.grad for a in args]


NAMES = ["out", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dinitial_state"]


@pytest.mark.parametrize("name", FALLBACKS)
def test_functions_match_transformers_fallbacks_by_the_oracle_rule(name):
    channel = "kda" in name
    tensors = rule_inputs(channel)
    ours = getattr(fla, name)
    fast = run(ours, tensors, torch.float32)
    fallback = run(FALLBACKS[name], tensors, torch.float32)
    oracle = run(ours, tensors, torch.float64)
    for what, f, n, o in zip(NAMES, fast, fallback, oracle):
        assert f.dtype == torch.float32, f"{name} {what}: {f.dtype}"
        check(f, n, o, 2 if what in ("out", "final_state") else 3, f"{name} {what}")


@pytest.mark.parametrize("channel", [False, True])
def test_float64_gradients_pass_gradcheck_with_packed_sequences(channel):
    q, k, v, g, beta, _ = rule_inputs(channel, b=1, t=9, hk=1, hv=2, dk=3, dv=2, seed=1)
    cu = torch.tensor([0, 4, 4, 9])
    s0 = torch.randn(3, 2, 3, 2, dtype=torch.float64)
    fn = fla.chunk_kda if channel else fla.chunk_gated_delta_rule
    args = [x.clone().requires_grad_() for x in (q, k, v, g, beta, s0)]

    def f(q, k, v, g, beta, s0):
        return fn(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=cu)

    assert torch.autograd.gradcheck(f, args)


def test_packed_sequences_equal_separate_calls():
    q, k, v, g, beta, _ = rule_inputs(False, b=1, t=150, seed=2)
    cu = torch.tensor([0, 3, 3, 100, 150])
    s0 = torch.randn(4, 4, 16, 8, dtype=torch.float64)
    args = [x.float() for x in (q, k, v, g, beta)]
    o, final = fla.chunk_gated_delta_rule(*args, initial_state=s0.float(), output_final_state=True, cu_seqlens=cu)
    for n in range(4):
        lo, hi = int(cu[n]), int(cu[n + 1])
        one, f1 = fla.chunk_gated_delta_rule(*(x[:, lo:hi] for x in args), initial_state=s0[n:n + 1].float(),
                                             output_final_state=True)
        assert torch.equal(one, o[:, lo:hi]) and torch.equal(f1[0], final[n])


def test_bad_inputs_are_refused_naming_the_argument():
    q, k, v, g, beta, s0 = (x.float() for x in rule_inputs(False, t=5))
    with pytest.raises(ValueError, match="^g: entry 3 is 0.5"):
        bad = g.clone()
        bad.view(-1)[3] = 0.5
        fla.chunk_gated_delta_rule(q, k, v, bad, beta)
    with pytest.raises(ValueError, match="not a multiple of the 2 key heads"):
        fla.chunk_gated_delta_rule(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ValueError, match="^cu_seqlens: packed sequences need a batch of 1"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="^initial_state: dimension length"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0[:1])
    with pytest.raises(ValueError, match="head_first"):
        fla.chunk_gated_delta_rule(q, k, v, g, beta, head_first=True)


def small(name):
    """A tiny config of ``name`` (one linear-attention and one full-attention layer) and its
    causal-LM class."""
    t = transformers
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, layer_types=["linear_attention", "full_attention"])
    gated = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
                 linear_num_value_heads=4)
    if name == "qwen3_next":
        return t.Qwen3NextConfig(**common, **gated, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                 shared_expert_intermediate_size=16, experts_implementation="eager"), t.Qwen3NextForCausalLM
    if name == "qwen3_5":
        return t.Qwen3_5TextConfig(**common, **gated), t.Qwen3_5ForCausalLM
    if name == "olmo_hybrid":
        return t.OlmoHybridConfig(**common, **gated), t.OlmoHybridForCausalLM
    common.update(num_key_value_heads=2, head_dim=None)
    return t.KimiLinearConfig(**common, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                              v_head_dim=8, linear_head_dim=8, linear_num_heads=2, moe_intermediate_size=16,
                              num_local_experts=4, num_experts_per_tok=2,
                              experts_implementation="eager"), t.KimiLinearForCausalLM


MODELS = ["qwen3_next", "qwen3_5", "olmo_hybrid", "kimi_linear"]


@pytest.fixture
def counted(monkeypatch):
    """The native delta-rule calls ``attn.fla`` makes, as a list that fills."""
    calls, native = [], fla._attn

    class Counting:
        def __getattr__(self, name):
            fn = getattr(native, name)
            if not name.startswith("delta_"):
                return fn

            def counted_call(*args):
                calls.append(name)
                return fn(*args)

            return counted_call

    monkeypatch.setattr(fla, "_attn", Counting())
    yield calls
    attn.hf.register()


def build(name, kernels, dtype, seed=0):
    """The model with the same random weights, its linear attention on attn (``kernels``) or on its
    PyTorch fallback."""
    (attn.hf.register if kernels else attn.hf.restore_delta_rule)()
    config, cls = small(name)
    torch.manual_seed(seed)
    model = cls(config)
    # Non-trivial decays and gates: the initialisation leaves some parameters at constants.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.to(dtype)


def padded_inputs(config, b=2, t=23):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, config.vocab_size, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, :5] = 0
    ids[1, :5] = config.pad_token_id
    labels = ids.masked_fill(mask == 0, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", MODELS)
def test_hybrid_models_match_their_pytorch_fallbacks(name, mode, counted):
    kwargs = padded_inputs(small(name)[0])
    real = kwargs["attention_mask"].bool()
    logits, grads = [], []
    for kernels, dtype in ((True, torch.float32), (False, torch.float32), (True, torch.float64)):
        model = build(name, kernels, dtype).train(mode == "train")
        counted.clear()
        out = model(**kwargs)
        out.loss.backward()
        assert bool(counted) == kernels, f"{name}: attn's kernels called {len(counted)} times"
        if kernels:
            assert "delta_backward" in counted
        logits.append(out.logits.detach()[real])
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
    check(*logits, 2, f"{name} logits")
    ga, gf, g64 = grads
    assert ga.keys() == gf.keys() == g64.keys() and len(ga) > 10
    linear = [n for n in ga if "linear_attn" in n or "self_attn" in n and "layers.0." in n]
    assert linear, f"{name}: no linear-attention parameter"
    for p in ga:
        check(ga[p], gf[p], g64[p], 3, f"{name} grad {p}")
        assert ga[p].abs().max() > 0, f"{name}: grad {p} is zero"


@pytest.mark.parametrize("name", MODELS)
def test_greedy_generation_with_the_recurrent_cache_matches_the_fallback(name, counted):
    config = small(name)[0]
    kwargs = padded_inputs(config)
    kwargs.pop("labels")
    tokens = []
    for kernels in (True, False):
        model = build(name, kernels, torch.float32).eval()
        counted.clear()
        with torch.no_grad():
            out = model.generate(**kwargs, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                 pad_token_id=config.pad_token_id)
        assert out.shape[1] == kwargs["input_ids"].shape[1] + 16
        assert bool(counted) == kernels
        tokens.append(out)
    assert torch.equal(*tokens)
