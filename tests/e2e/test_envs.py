"""Multi-turn episodes end to end (real Ray, ColossalAI, a tiny model): episodes reach more than one turn, the
environment's tokens cross to the consumer masked out of the loss, and training consumes them."""

import numpy as np
import pytest
import ray
import torch

from tests.e2e.runs import start_run

ROWS = [{"prompt": f"{a}+{b}=", "gt_answer": str(a + b)} for a in range(8) for b in range(8)]
TOOL = {"system_prompt": "Run <tool>code</tool> or answer in \\boxed{}.", "nudge": "Wrong, try again."}
EPISODES = dict(
    data={"train": ROWS},
    generation={"max_new_tokens": 8, "max_prompt_tokens": 192},
    reward={"fn": "math", "env": {"name": "tool_math", "kwargs": TOOL, "max_turns": 3, "max_tokens": 192}},
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random model tilted to end its turns early: every embedding carries a large first component, so the
    normalised hidden state is mostly that component, and the LM head maps it to the end-of-sequence token with
    about a quarter of the probability (a random model would rarely stop within a turn's 8 tokens)."""
    from transformers import AutoModelForCausalLM

    from coati.testing import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("env_model"), num_heads=2, vocab_multiple=8)  # vLLM: head 32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 5.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[model.config.eos_token_id, 0] = 0.45
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_episodes_take_several_turns_and_train_only_on_sampled_tokens(ray_cluster, tiny, backend):
    run = start_run(tiny, backend=backend, **EPISODES)
    try:
        batch = ray.get(run.producers[0].generate.remote(4))
        out = run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
    finally:
        run.shutdown()
    # A random model neither calls the tool nor answers: it is told to, up to the turn limit.
    assert batch.extras["turns"].max() > 1 and batch.loss_mask is not None
    for i in np.flatnonzero(batch.extras["turns"] > 1)[:4]:
        n = batch.response_lengths[i]
        ids, mask = batch.response_ids[i, :n], batch.loss_mask[i, :n]
        assert "Wrong" in run.tokenizer.decode(ids[~mask]) and "Wrong" not in run.tokenizer.decode(ids[mask])
        assert not batch.rollout_logprobs[i, :n][~mask].any()
    assert [m["step"] for m in out["history"]] == [1, 2]
    assert all(np.isfinite(m["loss/policy"]) and m["env/turns_mean"] > 1 for m in out["history"])
    assert [m["reward/sandbox_degraded"] for m in out["history"]] == [0.0, 0.0]  # tool calls ran under bwrap
    # The consumer's loss covers the sampled tokens only: there the engine's log-probs match the trainer's; on the
    # environment's tokens (no engine log-prob, 0 in the record) the gap would be the tokens' whole log-probability.
    assert out["history"][0]["rollout/engine_trainer_gap_abs"] < 0.1
