"""The trainer's forward on a real tiny model (no Ray): dropping the columns that are padding in every row of a
micro-batch changes neither the log-probs of real tokens nor the gradients, and every forward layout gives the model's
own log-probs and gradients."""

import numpy as np
import pytest
import torch

from coati.distributed.record import batch_from_responses
from coati.distributed.trainer.forward import sequence_logprobs, trim_padding
from coati.testing import build_tiny_model


def test_trimmed_micro_batch_gives_the_padded_one_s_logprobs_and_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_model(tmp_path / "m", vocab_multiple=8), dtype=torch.float32
    )
    # A step's batch: prompts up to 9 tokens and responses up to 11; the micro-batch takes the two short rows.
    prompts = [[5, 6], [7, 8, 9], list(range(10, 19))]
    batch = batch_from_responses(prompts, 1, [[3, 4], [5], list(range(20, 31))], None, [True] * 3, pad_id=0)
    rows = np.array([0, 1])
    full = {
        k: torch.from_numpy(getattr(batch, k)[rows])
        for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    }
    trimmed = trim_padding(**full)
    assert trimmed["prompt_ids"].shape == (2, 3) and trimmed["response_ids"].shape == (2, 2)
    results = []
    for inputs in (full, trimmed):
        model.zero_grad()
        lp, _ = sequence_logprobs(model, **inputs, temperature=0.7)
        mask = inputs["response_mask"].float()
        (-(lp * mask).sum() / mask.sum()).backward()
        results.append((lp, [p.grad.clone() for p in model.parameters()]))
    (lp_full, g_full), (lp_trim, g_trim) = results
    r = lp_trim.shape[1]
    m = full["response_mask"][:, :r]
    torch.testing.assert_close(lp_trim[m], lp_full[:, :r][m], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_full, g_trim, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def reference_logprobs(model, inputs, temperature):
    """The definition: softmax of the model's own logits over prompt + response, at the temperature."""
    from coati.distributed.algo.logprobs import entropy_from_logits, token_logprobs
    from coati.distributed.trainer.forward import model_inputs, response_logits

    logits = response_logits(model(**model_inputs(**inputs)).logits, inputs["response_ids"].shape[1])
    return (
        token_logprobs(logits, inputs["response_ids"], temperature),
        entropy_from_logits(logits.detach(), temperature),
    )


@pytest.mark.parametrize("layout", ["rows", "prompt_cache", "packed", "packed+checkpointing"])
def test_every_layout_gives_the_model_s_own_logprobs_entropy_and_gradients(tmp_path, layout):
    """Each forward layout (every row in full; each group's prompt once through a shared KV cache; each group packed in
    one row under a tree mask, the output layer on real tokens only) against the model's own logits: log-probs,
    entropy and every parameter's gradient of a masked loss, in fp32. Groups of 2 with prompts of 4, 2 and 3 tokens
    and responses of 1 to 5 (one group's responses shorter than another's prompt). Packing needs no KV cache, so it
    also runs under gradient checkpointing (layers recomputed in the backward)."""
    from transformers import AutoModelForCausalLM

    from coati.distributed.trainer.forward import LAYOUTS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_model(tmp_path / "m", vocab_multiple=8), dtype=torch.float32
    )
    responses = [[3, 4, 5], [6], [7, 8, 9, 10, 11], [12, 13], [14], [15, 16, 17, 18]]
    batch = batch_from_responses([[5, 6, 7, 8], [9, 10], [11, 12, 13]], 2, responses, None, [True] * 6, pad_id=0)
    inputs = {
        k: torch.from_numpy(getattr(batch, k)) for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    }
    m = inputs["response_mask"]
    layout, checkpointing = layout.partition("+")[::2]
    results = []
    for name in ("reference", layout):
        model.zero_grad()
        if name == "reference":
            lp, entropy = reference_logprobs(model, inputs, 0.7)
        else:
            if checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                model.train()
                assert model.model.gradient_checkpointing
            group = {} if name == "rows" else {"group_size": 2}
            lp, entropy = LAYOUTS[name](model, **inputs, **group, temperature=0.7, with_entropy=True)
            assert (lp[~m] == 0).all() and (entropy[~m] == 0).all()  # padding: 0, never the vocabulary's work
        (-(lp * m).sum() / m.sum()).backward()
        results.append((lp, entropy, [p.grad.clone() for p in model.parameters()]))
    (lp_ref, h_ref, g_ref), (lp, h, g) = results
    torch.testing.assert_close(lp[m], lp_ref[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h[m], h_ref[m], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_ref, g, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_pair_cost_is_attention_flops_per_pair_over_linear_flops_per_token(tmp_path):
    """4 x query width per layer per query-key pair, against 2 x the parameters outside the embedding and output layer
    per token: counted here from the layers' own parameters."""
    from transformers import AutoModelForCausalLM

    from coati.distributed.trainer.forward import pair_cost

    for tied in (False, True):
        model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / f"m{tied}", tie_word_embeddings=tied))
        layers = model.model.layers
        dense = sum(p.numel() for p in layers.parameters()) + sum(p.numel() for p in model.model.norm.parameters())
        query_width = layers[0].self_attn.q_proj.out_features
        assert pair_cost(model) == pytest.approx(4 * query_width * len(layers) / (2 * dense))


def test_a_model_whose_logits_are_not_its_output_head_s_is_refused_and_soft_capping_is_the_heads(tmp_path):
    """Cohere scales its logits after the output layer by a factor the trainer does not apply: refused at setup.
    Gemma 2 soft-caps its logits (cap * tanh(logits / cap)): the trainer's head applies the same cap, so its
    log-probs are the model's own; a Llama-style model passes. A NaN weight is named as such."""
    from transformers import AutoModelForCausalLM, CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM

    from coati.distributed.trainer.forward import DecoderStates, check_output_layer

    check_output_layer(AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "llama")))
    scaled = CohereForCausalLM(
        CohereConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            logit_scale=0.5,
        )
    )
    with pytest.raises(ValueError, match="CohereForCausalLM.s logits are not its output layer"):
        check_output_layer(scaled)
    capped = Gemma2ForCausalLM(
        Gemma2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            final_logit_softcapping=1.0,
        )
    )
    check_output_layer(capped)
    ids = torch.arange(1, 9)[None]
    with torch.no_grad(), DecoderStates(capped) as d:
        logits = capped(input_ids=ids).logits
        assert logits.abs().max() < 1.0  # the cap is in force ...
        torch.testing.assert_close(d.lm_head(d.states[0]), logits)  # ... and the trainer's head applies it
    broken = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "nan"))
    with torch.no_grad():
        broken.model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite \(NaN or infinite\) weights in \['model.layers.1.mlp.down_proj"):
        check_output_layer(broken)


@pytest.mark.parametrize("layout", ["rows", "prompt_cache"])
@pytest.mark.parametrize("arch", ["llava", "idefics3"])
def test_image_prompts_give_the_model_s_own_logprobs_and_gradients_in_each_layout(tmp_path, layout, arch):
    """A tiny LLaVA's and Idefics3's groups of two rows, each group with its own picture (``row_tensors`` carries
    them once per prompt): each layout's log-probs and gradients are a plain forward's with every row's image, and
    its projector gets a gradient (the image tokens are read); packing refuses image rows."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from coati.distributed.record import attach_pixels
    from coati.distributed.rollout.images import render_with_images
    from coati.distributed.trainer.forward import LAYOUTS, model_inputs, packed_group_logprobs, row_tensors
    from coati.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "vlm", arch=arch)
    processor = AutoProcessor.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    prompts, pixels = [], []
    for colour, question in (((255, 0, 0), "How many?"), ((0, 0, 255), "Which colour is it?")):
        ids, px = render_with_images(processor, {"prompt": question, "images": [Image.new("RGB", (40, 30), colour)]})
        prompts.append(ids)
        pixels.append(px)
    responses = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14]]
    batch = attach_pixels(batch_from_responses(prompts, 2, responses, None, [True] * 4, pad_id=0), pixels, 2)
    t = row_tensors(batch, np.arange(4), torch.device("cpu"))
    assert t["images"][0] is t["images"][1] and t["images"][0] is not t["images"][2]  # once a prompt

    def plain():
        inputs = model_inputs(*(t[k] for k in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")))
        images = {k: torch.cat([i[k] for i in t["images"]]) for k in t["images"][0]}
        logits = model(**inputs, **images).logits[:, t["prompt_ids"].shape[1] - 1 : -1]
        return torch.log_softmax(logits, -1).gather(-1, t["response_ids"][..., None])[..., 0]

    results = []
    for run in (plain, lambda: LAYOUTS[layout](model, **t, **({} if layout == "rows" else {"group_size": 2}))[0]):
        model.zero_grad()
        lp = run()
        mask = t["response_mask"].bool()
        lp = lp[mask]
        (-lp.mean()).backward()
        parts = model.model.multi_modal_projector if arch == "llava" else model.model.connector
        projector = torch.cat([p.grad.reshape(-1) for p in parts.parameters()])
        results.append(
            (lp.detach(), projector.clone(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        )
    (lp_a, proj_a, g_a), (lp_b, proj_b, g_b) = results
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    assert proj_b.abs().sum() > 0
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    with pytest.raises(AssertionError, match="packed rows take no images"):
        packed_group_logprobs(model, **t, group_size=2)


def test_the_vision_tower_is_frozen_unless_asked_to_train(tmp_path):
    from coati.distributed.trainer.config import ConsumerConfig
    from coati.distributed.trainer.engine import load_policy
    from coati.testing import build_tiny_vlm

    path = str(build_tiny_vlm(tmp_path / "vlm"))
    for freeze in (True, False):
        model = load_policy(path, ConsumerConfig(freeze_vision_tower=freeze), torch.device("cpu"), seed=0)
        trains = {n: p.requires_grad for n, p in model.named_parameters()}
        tower = [v for n, v in trains.items() if "vision_tower" in n]
        assert tower and all(v is not freeze for v in tower)
        assert all(v for n, v in trains.items() if "vision_tower" not in n)


def test_prompts_with_unlike_image_counts_share_a_pass_as_each_alone(tmp_path):
    """Idefics3 holds image inputs [prompts, images, ...]: a prompt with one picture and one with two go in one pass
    (the first padded with an all-zero image, which the model drops), each row's log-probs as in a pass of its own."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from coati.distributed.record import attach_pixels
    from coati.distributed.rollout.images import render_with_images
    from coati.distributed.trainer.forward import row_tensors
    from coati.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "vlm", arch="idefics3")
    processor = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    red, blue = Image.new("RGB", (40, 30), (255, 0, 0)), Image.new("RGB", (30, 40), (0, 0, 255))
    rendered = [
        render_with_images(processor, {"prompt": "one", "images": [red]}),
        render_with_images(processor, {"prompt": "two", "images": [red, blue]}),
    ]
    assert rendered[0][1]["pixel_values"].shape[1] == 1 and rendered[1][1]["pixel_values"].shape[1] == 2
    batch = attach_pixels(
        batch_from_responses([r[0] for r in rendered], 1, [[5, 6], [7, 8, 9]], None, [True] * 2, pad_id=0),
        [r[1] for r in rendered],
        1,
    )
    with torch.no_grad():
        both, _ = sequence_logprobs(model, **row_tensors(batch, np.arange(2), torch.device("cpu")))
        for i in range(2):
            alone, _ = sequence_logprobs(model, **row_tensors(batch, np.array([i]), torch.device("cpu")))
            r = int(batch.response_lengths[i])
            torch.testing.assert_close(both[i, :r], alone[0, :r], rtol=0, atol=1e-5)
