"""The trainer's CPU attention (``coati.distributed.model.attention``): its bf16 path computes what SDPA computes, to
bf16
rounding, outputs and gradients, under every mask the trainer's layouts give (a packed group's tree, left padding
with a query that may attend to nothing, plain causal, a single query), with grouped key/value heads; anything else
goes to SDPA unchanged; and a model switched to it trains every layout to SDPA's log-probs and gradients."""

import types

import pytest
import torch

from coati.distributed.model import attention
from coati.testing import build_tiny_model

HEADS, KV_HEADS, D = 6, 2, 16


def module():
    return types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, is_causal=True)


def masks(b: int, q_len: int, k_len: int) -> dict:
    ar_q, ar_k = torch.arange(k_len - q_len, k_len), torch.arange(k_len)
    causal = ar_q[:, None] >= ar_k[None]
    tree = causal & ((ar_k[None] < 8) | (ar_q[:, None] // 8 == ar_k[None] // 8))  # a prompt of 8, responses of 8
    padded = causal[None, None].repeat(b, 1, 1, 1)
    padded[0, :, :, :3] = False  # row 0: 3 keys of left padding, so its first query may attend to nothing
    return {"tree": tree[None, None].expand(b, 1, q_len, k_len), "padded": padded, "causal": None}


def reference(q, k, v, mask, causal: bool):
    """Attention in float64: softmax(q k^T / sqrt(d) + mask) v, key/value heads repeated."""
    q, k, v = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], 1), v.double()
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is None and causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(torch.float64).min)
    return (scores.softmax(-1) @ v).transpose(1, 2)


def inputs(b, q_len, k_len, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, HEADS, q_len, D), (b, KV_HEADS, k_len, D), (b, KV_HEADS, k_len, D))
    return [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]


@pytest.mark.parametrize("mask_name,q_len", [("tree", 24), ("padded", 24), ("causal", 24), ("causal", 1)])
def test_bf16_path_matches_the_definition_to_bf16_rounding(mask_name, q_len):
    b, k_len = 2, 24
    q, k, v = inputs(b, q_len, k_len, torch.bfloat16)
    mask = masks(b, q_len, k_len)[mask_name]
    causal = mask is None and q_len > 1
    assert attention.takes_bf16_path(q, k, mask, 0.0, causal)
    out, _ = attention.attention(module(), q, k, v, mask)
    assert out.shape == (b, q_len, HEADS, D) and out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    want = reference(q, k, v, mask, causal)
    real = torch.ones(b, q_len, dtype=torch.bool)
    if mask_name == "padded":
        real[0, :3] = False  # padding queries: any finite output will do, the trainer drops them
    torch.testing.assert_close(out.double()[real], want[real], atol=2e-2, rtol=2e-2)
    weights = (
        torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * real[..., None, None]
    )
    got = torch.autograd.grad((out.double() * weights).sum(), (q, k, v))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = torch.autograd.grad((reference(qd, kd, vd, mask, causal) * weights).sum(), (qd, kd, vd))
    for name, a, e in zip("qkv", got, expected, strict=True):
        scale = e.abs().max()
        assert (a.double() - e).abs().max() <= 2e-2 * scale, name


@pytest.mark.parametrize("case", ["fp32", "too many scores", "dropout", "float mask", "mask per head"])
def test_everything_else_goes_to_sdpa_unchanged(case, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, n = 2, 24
    q, k, v = inputs(b, n, n, torch.float32 if case == "fp32" else torch.bfloat16)
    mask = masks(b, n, n)["tree"]
    kw = {}
    if case == "too many scores":
        monkeypatch.setattr(attention, "MAX_SCORES", b * HEADS * n * n - 1)
    if case == "float mask":
        mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, -1e4)
    if case == "mask per head":
        mask = mask.expand(b, HEADS, n, n)
    if case == "dropout":
        kw["dropout"] = 0.5
    torch.manual_seed(0)
    got, _ = attention.attention(module(), q, k, v, mask, **kw)
    torch.manual_seed(0)
    want, _ = sdpa_attention_forward(module(), q, k, v, mask, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", ["rows", "prompt_cache", "packed"])
def test_a_model_on_it_trains_every_layout_as_on_sdpa(tmp_path, layout, monkeypatch):
    """bf16 autocast over fp32 weights, as the trainer runs on a CPU with native bf16: log-probs and every
    parameter's gradient as with SDPA attention, to bf16 rounding, every layer's attention on the bf16 path."""
    from transformers import AutoModelForCausalLM

    from coati.distributed.record import batch_from_responses
    from coati.distributed.trainer.forward import LAYOUTS

    path = build_tiny_model(tmp_path / "m", vocab_multiple=8)
    responses = [[3, 4, 5], [6], [7, 8, 9, 10, 11], [12, 13], [14], [15, 16, 17, 18]]
    batch = batch_from_responses([[5, 6, 7, 8], [9, 10], [11, 12, 13]], 2, responses, None, [True] * 6, pad_id=0)
    t = {k: torch.from_numpy(getattr(batch, k)) for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")}
    m = t["response_mask"].bool()
    taken, paths = attention.takes_bf16_path, []
    monkeypatch.setattr(attention, "takes_bf16_path", lambda *a: paths.append(taken(*a)) or paths[-1])
    results = []
    for switch in (False, True):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if switch:
            assert attention.use(model, torch.device("cpu"))
        assert model.config._attn_implementation == (attention.NAME if switch else "sdpa")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            group = {} if layout == "rows" else {"group_size": 2}
            lp, _ = LAYOUTS[layout](model, **t, **group, temperature=0.7)
        (-(lp * m).sum() / m.sum()).backward()
        results.append((lp, {n: p.grad for n, p in model.named_parameters()}))
    passes = 2 if layout == "prompt_cache" else 1  # the prompts' forward, then the responses'
    assert paths == [True] * passes * model.config.num_hidden_layers
    (lp_sdpa, g_sdpa), (lp, g) = results
    torch.testing.assert_close(lp[m], lp_sdpa[m], atol=3e-2, rtol=3e-2)
    for name, want in g_sdpa.items():
        assert (g[name] - want).abs().max() <= 5e-2 * want.abs().max() + 1e-6, name


def test_only_cpu_sdpa_models_switch(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", vocab_multiple=8)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    assert not attention.use(model, torch.device("cpu")) and model.config._attn_implementation == "eager"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert not attention.use(model, torch.device("cuda", 0)) and model.config._attn_implementation == "sdpa"
