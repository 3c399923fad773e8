"""Sequence parallelism (all_to_all) against the whole model, on two gloo ranks with the consumer's own plugin
(``make_plugin``: SP=2, torch DDP over DP x SP) and ``sequence_parallel``: for every dense family, the same rows
through the trainer's two SP layouts (padded rows with left-padded prompts, and groups packed in one row under the
tree mask), an odd number of columns (so the split pads), give each response token's log-prob, the loss and every
gradient of the model computed whole in the same process."""

from __future__ import annotations

import json

import pytest
import torch

from coati.distributed.runtime.placement import free_port
from coati.testing import ARCHITECTURES, MOE_ARCHITECTURES
from tests.helpers import tiny_families

DENSE = [a for a in ARCHITECTURES if a not in MOE_ARCHITECTURES]
TOL = 2e-5


def _rows(vocab: int):
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(1, vocab, (4, 5), generator=g)
    prompt[2:] = prompt[2]  # rows 2, 3 share a prompt, as rows 0, 1 do
    prompt[1] = prompt[0]
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[2:, :2] = 0  # the second group's prompt is left-padded
    response = torch.randint(1, vocab, (4, 6), generator=g)
    response_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 3 + [0] * 3])
    return prompt, prompt_mask, response, response_mask


def _pass(model, layout, rows, group=None):
    from coati.distributed.trainer import sequence_parallel
    from coati.distributed.trainer.forward import LAYOUTS, causal_lm

    extra = {} if layout == "rows" else {"group_size": 2}
    widths = []
    embed = causal_lm(model).get_input_embeddings()
    hook = embed.register_forward_pre_hook(lambda _m, args: widths.append(args[0].shape[1]))
    with sequence_parallel.split(causal_lm(model), group) if group is not None else _nothing():
        lp, _ = LAYOUTS[layout](model, *rows, **extra)
    hook.remove()
    mask = rows[3].bool()
    return lp, -(lp * mask).sum() / mask.sum(), widths[0]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _rank(rank: int, port: int, paths: dict[str, str], out: str) -> None:
    from colossalai.booster import Booster
    from transformers import AutoModelForCausalLM

    from coati.distributed.model import attention
    from coati.distributed.trainer import sequence_parallel
    from coati.distributed.trainer.config import ConsumerConfig, PluginConfig
    from coati.distributed.trainer.engine import boosted_policy, launch_colossalai, make_plugin
    from coati.distributed.trainer.forward import causal_lm

    torch.set_num_threads(1)
    device = launch_colossalai(rank, 2, "127.0.0.1", port, seed=0)
    cfg = ConsumerConfig(num_consumer_procs=2, plugin=PluginConfig(sp_size=2))
    results = {}
    for arch, path in paths.items():
        whole = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        attention.use(whole, device)
        rows = _rows(whole.config.vocab_size)
        plugin = make_plugin(cfg)
        booster = Booster(plugin=plugin)
        model, optimizer, _ = boosted_policy(path, cfg, plugin, booster, device, seed=0)
        sequence_parallel.use(causal_lm(model), plugin.sp_group)
        inner = model.unwrap()
        for layout in ("rows", "packed"):
            whole.zero_grad()
            lp, loss, width = _pass(whole, layout, rows)
            loss.backward()
            optimizer.zero_grad()
            sp_lp, sp_loss, sp_width = _pass(model, layout, rows, plugin.sp_group)
            booster.backward(sp_loss, optimizer)  # DDP's mean over the two ranks
            grads = dict(whole.named_parameters())
            results[f"{arch}/{layout}"] = {
                "columns": [width, sp_width],
                "logprob_gap": float((sp_lp - lp).abs().max()),
                "loss": [loss.item(), sp_loss.item()],
                "grad_gap": max(
                    float((p.grad - grads[n].grad).abs().max())
                    for n, p in inner.named_parameters()
                    if p.grad is not None
                ),
                "grads": sum(p.grad is not None for p in inner.parameters()),
                "params": sum(1 for _ in inner.parameters()),
            }
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def dense_paths(tmp_path_factory):
    return tiny_families(tmp_path_factory.mktemp("sp"), DENSE, hidden_size=64, num_heads=4, num_kv_heads=2)


def test_sp2_gives_the_whole_models_logprobs_loss_and_gradients(dense_paths, tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "result")
    mp.spawn(_rank, args=(free_port(), dense_paths, out), nprocs=2, join=True)
    for rank in (0, 1):
        with open(f"{out}.{rank}") as f:
            results = json.load(f)
        assert len(results) == 2 * len(DENSE)
        for case, r in results.items():
            whole, own = r["columns"]
            assert whole % 2 == 1 and own == (whole + 1) // 2, (case, r)  # each rank computes half (padded)
            assert r["logprob_gap"] < TOL, (case, r)
            assert r["loss"][1] == pytest.approx(r["loss"][0], abs=TOL), (case, r)
            assert r["grad_gap"] < TOL, (case, r)
            assert r["grads"] == r["params"], (case, r)  # every weight got its gradient
