"""Tensor parallelism checked where it breaks: two gloo ranks build the consumer's ColossalAI plugin (TP=2, the
``DecoderLMPolicy``) around a model, and every step's log-probs and the weights after each SGD update are compared
with the same model trained whole in the same process. Used by the suite (``test_architectures.py``) and by
``benchmarks/bench_architectures.py``.

Returns, per model folder, {"logprob_gap": [per step], "weight_gap": [per step], "worst": name of the weight that
differs most} or {"error": "..."} when the plugin refuses the model.
"""

from __future__ import annotations

import json
import os
import tempfile

from coati.distributed.runtime.placement import free_port

STEPS = 2
LR = 0.5
"""a large SGD step: a gradient that is wrong on one rank shows in the weights at once (Adam's first step would hide
a wrong magnitude)"""


def tp_parity(paths: list[str], steps: int = STEPS) -> dict[str, dict]:
    """Train each model ``steps`` SGD steps under TP=2 (two processes) and whole; the gaps (module docstring)."""
    import torch.multiprocessing as mp

    out = tempfile.mktemp(suffix=".json")
    mp.spawn(_rank, args=(2, free_port(), list(paths), steps, out), nprocs=2, join=True)
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    return result


def _logprobs(model, ids):
    import torch

    logits = model(input_ids=ids, use_cache=False).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def _rank(rank: int, world: int, port: int, paths: list[str], steps: int, out: str) -> None:
    import copy

    import torch

    torch.set_num_threads(1)
    import colossalai
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import AutoModelForCausalLM

    from coati.distributed.trainer.colossal_cpu import apply_cpu_shims
    from coati.distributed.trainer.colossal_policy import DecoderLMPolicy, gathered_weights

    apply_cpu_shims()
    colossalai.launch(rank, world, "127.0.0.1", port, backend="gloo", seed=0)
    results = {}
    for path in paths:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.config.use_cache = False
        whole = copy.deepcopy(model)
        plugin = HybridParallelPlugin(
            tp_size=2,
            pp_size=1,
            precision="fp32",
            max_norm=1e30,
            make_vocab_size_divisible_by=2,
            enable_metadata_cache=False,
            parallel_output=False,
            custom_policy=DecoderLMPolicy(),
        )
        try:
            sharded, optimizer, *_ = Booster(plugin=plugin).boost(model, torch.optim.SGD(model.parameters(), lr=LR))
        except (ValueError, NotImplementedError, AttributeError, AssertionError) as e:
            results[path] = {"error": f"{type(e).__name__}: {e}"}
            continue
        reference = torch.optim.SGD(whole.parameters(), lr=LR)
        generator = torch.Generator().manual_seed(1)
        vocab = whole.config.vocab_size
        gaps, weight_gaps, worst = [], [], ""
        for _ in range(steps):
            ids = torch.randint(3, vocab, (2, 12), generator=generator)
            weights = torch.randn(2, 11, generator=generator)
            lp, lp_whole = _logprobs(sharded, ids), _logprobs(whole, ids)
            gaps.append(float((lp.detach() - lp_whole.detach()).abs().max()))
            optimizer.backward((lp * weights).mean())
            optimizer.step()
            optimizer.zero_grad()
            (lp_whole * weights).mean().backward()
            reference.step()
            reference.zero_grad()
            full = gathered_weights(sharded.unwrap())
            diffs = {n: float((full[n] - p.detach()).abs().max()) for n, p in whole.named_parameters() if n in full}
            worst = max(diffs, key=diffs.get)
            weight_gaps.append(diffs[worst])
        results[path] = {"logprob_gap": gaps, "weight_gap": weight_gaps, "worst": worst}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
