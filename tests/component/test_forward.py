"""The trainer's forward on a real tiny model (no Ray): dropping the columns that are padding in every row of a
micro-batch changes neither the log-probs of real tokens nor the gradients."""

import numpy as np
import torch

from coati.distributed.forward import sequence_logprobs, trim_padding
from coati.distributed.rollout import batch_from_responses
from coati.models import build_tiny_model


def test_trimmed_micro_batch_gives_the_padded_one_s_logprobs_and_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", vocab_multiple=8), dtype=torch.float32)
    # A step's batch: prompts up to 9 tokens and responses up to 11; the micro-batch takes the two short rows.
    prompts = [[5, 6], [7, 8, 9], list(range(10, 19))]
    batch = batch_from_responses(prompts, 1, [[3, 4], [5], list(range(20, 31))], None, [True] * 3, pad_id=0)
    rows = np.array([0, 1])
    full = {k: torch.from_numpy(getattr(batch, k)[rows]) for k in ("prompt_ids", "prompt_mask", "response_ids",
                                                                    "response_mask")}  # fmt: skip
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


def test_each_prompt_computed_once_per_group_gives_the_full_forward_s_logprobs_and_gradients(tmp_path):
    from transformers import AutoModelForCausalLM

    from coati.distributed.forward import shared_prompt_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", vocab_multiple=8), dtype=torch.float32)
    responses = [[3, 4, 5], [6], [7, 8, 9, 10, 11], [12, 13], [14], [15, 16, 17, 18]]
    batch = batch_from_responses([[5, 6, 7, 8], [9, 10], [11, 12, 13]], 2, responses, None, [True] * 6, pad_id=0)
    inputs = {k: torch.from_numpy(getattr(batch, k)) for k in ("prompt_ids", "prompt_mask", "response_ids",
                                                                "response_mask")}  # fmt: skip
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            lp, entropy = shared_prompt_logprobs(model, **inputs, group_size=2, temperature=0.7, with_entropy=True)
        else:
            lp, entropy = sequence_logprobs(model, **inputs, temperature=0.7, with_entropy=True)
        mask = inputs["response_mask"].float()
        (-(lp * mask).sum() / mask.sum()).backward()
        results.append((lp, entropy, [p.grad.clone() for p in model.parameters()]))
    (lp_full, h_full, g_full), (lp_shared, h_shared, g_shared) = results
    m = inputs["response_mask"]
    torch.testing.assert_close(lp_shared[m], lp_full[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h_shared[m], h_full[m], atol=1e-5, rtol=1e-5)
    for a, b in zip(g_full, g_shared, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
