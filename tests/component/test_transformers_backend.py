"""The transformers backend on CPU with tiny models built from configs."""

import numpy as np
import pytest
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.transformers_backend import TransformersBackend
from coati.distributed.trainer.forward import sequence_logprobs
from coati.testing import build_tiny_model


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    torch.set_num_threads(1)
    a = build_tiny_model(tmp_path_factory.mktemp("tiny_a"), seed=0)
    b = build_tiny_model(tmp_path_factory.mktemp("tiny_b"), seed=1)
    return a, b


def prompts(tok):
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_dict=False
        ),
        tok("x")["input_ids"],
        tok("a longer prompt here")["input_ids"],
    ]


def uniform_next_token(backend):
    """Zero the output layer: every token, EOS included, is equally likely (EOS within 64 tokens ~ half the time)."""
    backend.load_weights({"lm_head.weight": torch.zeros_like(backend.model.lm_head.weight)})


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_teacher_forced_forward(model_dirs, temperature):
    backend = TransformersBackend(
        str(model_dirs[0]), GenerationConfig(max_new_tokens=24, temperature=temperature, top_k=10, top_p=0.9)
    )
    torch.manual_seed(0)
    batch = backend.generate(prompts(backend.tokenizer), n=2)
    t = {k: torch.from_numpy(getattr(batch, k)) for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")}
    with torch.no_grad():
        ref, _ = sequence_logprobs(backend.model, **t, temperature=temperature)
    mask = t["response_mask"]
    got = torch.from_numpy(batch.rollout_logprobs)
    # Tolerance: KV-cached incremental decoding vs one full forward in float32.
    torch.testing.assert_close(got[mask], ref[mask], rtol=0, atol=1e-4)
    assert torch.all(got[~mask] == 0)
    # Sampling at temperature T with top-k/top-p: log-probs are of the temperature-scaled distribution only.
    assert (got[mask] < 0).all()


def test_n_samples_masks_stop_at_eos_and_truncation_flagged(model_dirs):
    backend = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=64))
    uniform_next_token(backend)
    torch.manual_seed(1)
    batch = backend.generate(prompts(backend.tokenizer), n=8)
    assert len(batch) == 24 and batch.group_ids.tolist() == [i for i in range(3) for _ in range(8)]
    eos = backend.tokenizer.eos_token_id
    ended = ~batch.truncated
    assert ended.any() and batch.truncated.any(), "seed should give both kinds of rows"
    for i in range(len(batch)):
        n = batch.response_lengths[i]
        row = batch.response_ids[i, :n]
        assert batch.response_mask[i, :n].all() and not batch.response_mask[i, n:].any()
        if batch.truncated[i]:
            assert n == 64 and eos not in row.tolist()
        else:
            assert row[-1] == eos and eos not in row[:-1].tolist()  # mask stops at, and includes, the first EOS
    # Completions of one prompt differ (sampling), prompts repeat n times.
    assert len({tuple(r) for r in batch.response_ids[:8].tolist()}) > 1


def test_stop_strings_end_the_response(model_dirs):
    backend = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=64, stop_strings=("a",)))
    uniform_next_token(backend)
    torch.manual_seed(2)
    batch = backend.generate(prompts(backend.tokenizer), n=4)
    tok = backend.tokenizer
    stopped = 0
    for i in range(len(batch)):
        row = batch.response_ids[i, : batch.response_lengths[i]].tolist()
        # Stop strings match the decoded text (special tokens included, as generate's stop criteria do).
        assert "a" not in tok.decode(row[:-1]), tok.decode(row)
        if "a" in tok.decode(row):
            assert not batch.truncated[i]
            stopped += 1
    assert stopped > 0


def test_greedy_is_deterministic(model_dirs):
    backend = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=16))
    a = backend.generate(prompts(backend.tokenizer), n=2, greedy=True)
    b = backend.generate(prompts(backend.tokenizer), n=1, greedy=True)
    assert np.array_equal(a.response_ids[::2], b.response_ids)


def test_load_weights_full_partial_and_streamed(model_dirs):
    gen = GenerationConfig(max_new_tokens=16)
    a = TransformersBackend(str(model_dirs[0]), gen)
    b = TransformersBackend(str(model_dirs[1]), gen)
    ps = prompts(a.tokenizer)
    before = a.generate(ps, greedy=True).response_ids
    target = b.generate(ps, greedy=True).response_ids
    assert not np.array_equal(before, target)
    weights = b.state_dict()
    keys = list(weights)
    # Streamed in two partial buckets, as ray_broadcast_tensor_dict's on_bucket delivers them.
    a.load_weights(iter([{k: weights[k] for k in keys[::2]}, {k: weights[k] for k in keys[1::2]}]))
    assert np.array_equal(a.generate(ps, greedy=True).response_ids, target)
    # Same result as load_state_dict, bitwise.
    ref = TransformersBackend(str(model_dirs[0]), gen)
    ref.model.load_state_dict(weights)
    for k, v in ref.model.state_dict().items():
        assert torch.equal(a.model.state_dict()[k], v), k
    # A partial dict (one pipeline stage) changes only its own tensors.
    layer0 = {k: torch.zeros_like(v) for k, v in weights.items() if ".layers.0." in k}
    a.load_weights(layer0)
    after = a.model.state_dict()
    assert all(torch.equal(after[k], layer0[k]) for k in layer0)
    assert all(torch.equal(after[k], weights[k]) for k in weights if k not in layer0)


def test_load_weights_rejects_unknown_names_and_shapes(model_dirs):
    a = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=4))
    with pytest.raises(KeyError, match="names the model does not have"):
        a.load_weights({"nope.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="lm_head.weight: shape"):
        a.load_weights({"lm_head.weight": torch.zeros(2, 2)})


def test_bad_prompts(model_dirs):
    a = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=4, max_prompt_tokens=5))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        a.generate([[5], []])
    with pytest.raises(ValueError, match="prompt 0 has 6 tokens > max_prompt_tokens=5"):
        a.generate([[5] * 6])


def test_each_prompt_is_prefilled_once_and_samples_are_what_full_prefills_give(model_dirs):
    """n samples per prompt from one prefill equal, greedy, the n=1 run of the prompt repeated n times (every
    sequence prefilled on its own); the prefill runs on one row per prompt."""
    backend = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=16))
    ps = prompts(backend.tokenizer)
    calls = []
    prefill = backend._prefill
    backend._prefill = lambda ids, mask, n, images: calls.append(ids.shape) or prefill(ids, mask, n, images)
    shared = backend.generate(ps, n=3, greedy=True)
    full = backend.generate([p for p in ps for _ in range(3)], n=1, greedy=True)
    assert [tuple(c) for c in calls] == [(3, max(map(len, ps)) - 1)]
    assert np.array_equal(shared.response_ids, full.response_ids)
    np.testing.assert_allclose(shared.rollout_logprobs, full.rollout_logprobs, atol=1e-5)


def test_bf16_generation_takes_coati_attention_and_gives_sdpa_s_logprobs(model_dirs):
    """With bf16 weights on a CPU the backend generates on coati's attention (bf16 matmuls; much faster decode
    steps than SDPA's fused kernel); its rollout log-probs are what a full forward on SDPA attention gives, to bf16
    rounding."""
    from coati.distributed.model import attention

    backend = TransformersBackend(str(model_dirs[0]), GenerationConfig(max_new_tokens=24), dtype="bfloat16")
    assert backend.model.config._attn_implementation == attention.NAME
    torch.manual_seed(0)
    batch = backend.generate(prompts(backend.tokenizer), n=2)
    backend.model.set_attn_implementation("sdpa")
    t = {k: torch.from_numpy(getattr(batch, k)) for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")}
    with torch.no_grad():
        ref, _ = sequence_logprobs(backend.model, **t)
    mask = t["response_mask"].bool()
    diff = (torch.from_numpy(batch.rollout_logprobs)[mask] - ref.float()[mask]).abs()
    assert diff.mean() < 0.01 and diff.max() < 0.05, (diff.mean(), diff.max())


@pytest.mark.parametrize("n", [1, 2])
def test_a_vision_language_model_generates_from_each_prompt_s_images(tmp_path, n):
    """Two image prompts (a red and a blue square) through the tiny LLaVA's processor: the engine's log-probs are a
    plain forward's with each row's own image (the shared prefill with n = 2 reads each image once), and another
    row's image gives other ones."""
    from PIL import Image
    from transformers import AutoProcessor

    from coati.distributed.algo.logprobs import token_logprobs
    from coati.distributed.rollout.images import ImagePrompt
    from coati.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "vlm")
    processor = AutoProcessor.from_pretrained(path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompts, pixels = [], []
    for colour in ((255, 0, 0), (0, 0, 255)):
        rendered = processor(text=[text], images=[Image.new("RGB", (60, 40), colour)], return_tensors="np")
        prompts.append(rendered["input_ids"][0].tolist())
        pixels.append({"pixel_values": rendered["pixel_values"]})
    backend = TransformersBackend(str(path), GenerationConfig(max_new_tokens=6, temperature=1.0), dtype="float32")
    assert type(backend.model).__name__ == "LlavaForConditionalGeneration"
    torch.manual_seed(0)
    images = [ImagePrompt(ids, px, [], []) for ids, px in zip(prompts, pixels, strict=True)]
    batch = backend.generate(prompts, n=n, images=images)

    def forward(row_pixels):
        ids = torch.from_numpy(np.concatenate([batch.prompt_ids, batch.response_ids], 1))
        mask = torch.from_numpy(np.concatenate([batch.prompt_mask, batch.response_mask], 1)).long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        values = torch.cat([torch.from_numpy(row_pixels[i]["pixel_values"]) for i in range(len(batch))])
        with torch.no_grad():
            logits = backend.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, pixel_values=values
            ).logits
        p = batch.prompt_ids.shape[1]
        return token_logprobs(logits[:, p - 1 : -1], torch.from_numpy(batch.response_ids), 1.0)

    assert len(batch.pixels) == 2 and batch.pixel_index.tolist() == [i // n for i in range(2 * n)]  # once a group
    own = [batch.pixels[j] for j in batch.pixel_index]
    other = [pixels[1 - i // n] for i in range(len(batch))]
    mask = torch.from_numpy(batch.response_mask)
    got = torch.from_numpy(batch.rollout_logprobs)
    torch.testing.assert_close(got[mask], forward(own)[mask], rtol=0, atol=1e-4)
    assert (got[mask] - forward(other)[mask]).abs().max() > 1e-3
