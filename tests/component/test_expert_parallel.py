"""Expert parallelism against data parallelism, on two gloo ranks with the consumer's own plugin, policy and
optimizer (``make_plugin``, ``boosted_policy``, ``fold_clipping``): each rank's own batch through a tiny MoE (every
family of ``MOE_ARCHITECTURES``) whose
experts are split over the two ranks gives the loss, the averaged gradients (experts gathered), the clip's gradient
norm and, after one Adam step, the weights of the same model trained whole with its gradients averaged by hand.
One case routes every token to rank 0's experts (routing replay), so rank 1's experts get no token and its
all-to-alls carry nothing."""

from __future__ import annotations

import json

import pytest
import torch

from coati.distributed.runtime.placement import free_port
from coati.distributed.trainer.expert_parallel import even_chunks
from coati.testing import MOE_ARCHITECTURES
from tests.helpers import tiny_families

TOL = 2e-5
"""fp32: the experts see the same rows in another grouping; sums stay in the same order"""


def _batch(rank: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (3, 9), generator=torch.Generator().manual_seed(100 + rank))


def _loss(model, ids, routes):
    from coati.distributed.model import routing

    with routing.replay(routing.routers(model), routes):
        logits = model(input_ids=ids, use_cache=False).logits.float()
    return -torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).mean()


def _routes(ids, layers: int, experts: list[int] | None):
    if experts is None:
        return None
    return torch.tensor(experts, dtype=torch.int16).expand(*ids.shape, layers, len(experts)).clone()


def _rank(rank: int, port: int, cases: list[tuple[str, list[int] | None]], out: str) -> None:
    from coati.distributed.trainer.engine import launch_colossalai

    torch.set_num_threads(1)
    device = launch_colossalai(rank, 2, "127.0.0.1", port, seed=0)
    results = [_case(rank, device, path, forced) for path, forced in cases]
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


def _case(rank: int, device, path: str, forced: list[int] | None) -> dict:
    import torch.distributed as dist
    from colossalai.booster import Booster
    from transformers import AutoModelForCausalLM

    from coati.distributed.trainer.colossal_policy import gathered_weights
    from coati.distributed.trainer.config import ConsumerConfig, PluginConfig
    from coati.distributed.trainer.engine import boosted_policy, make_plugin
    from coati.distributed.trainer.expert_parallel import gather_experts
    from coati.distributed.trainer.grad_clip import clip_divisor, fold_clipping

    cfg = ConsumerConfig(num_consumer_procs=2, learning_rate=1e-2, plugin=PluginConfig(ep_size=2))
    whole = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = _batch(rank, whole.config.vocab_size)
    routes = _routes(ids, whole.config.num_hidden_layers, forced)

    # data parallelism by hand: the whole model, the two ranks' gradients averaged
    loss = _loss(whole, ids, routes)
    loss.backward()
    for p in whole.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(2)
    grads = {n: p.grad.clone() for n, p in whole.named_parameters()}  # before the clip scales them
    norm = float(torch.sqrt(sum(g.double().square().sum() for g in grads.values())))
    torch.nn.utils.clip_grad_norm_(whole.parameters(), cfg.max_grad_norm)
    torch.optim.Adam(whole.parameters(), lr=cfg.learning_rate).step()

    plugin = make_plugin(cfg)
    booster = Booster(plugin=plugin)
    model, optimizer, _ = boosted_policy(path, cfg, plugin, booster, device, seed=0)
    assert fold_clipping(optimizer, 1, 1, plugin.ep_group)
    inner = model.unwrap()
    ep_loss = _loss(inner, ids, routes)
    booster.backward(ep_loss, optimizer)
    model.sync_dp_grads()
    ep_norm = optimizer._compute_grad_norm([(p, p.grad) for p in inner.parameters()])
    grad_gap = max(float((gather_experts(p, p.grad) - grads[n]).abs().max()) for n, p in inner.named_parameters())
    local = {n: list(p.shape) for n, p in inner.named_parameters() if hasattr(p, "ep_group")}
    optimizer.step(div_scale=clip_divisor(ep_norm, cfg.max_grad_norm))
    after = gathered_weights(inner)
    weight_gap = max(float((after[n] - p.detach()).abs().max()) for n, p in whole.named_parameters())
    return {
        "case": [path, forced],
        "loss": [loss.item(), ep_loss.item()],
        "norm": [norm, ep_norm],
        "grad_gap": grad_gap,
        "weight_gap": weight_gap,
        "local_shapes": local,
    }


@pytest.fixture(scope="module")
def moe_paths(tmp_path_factory):
    return tiny_families(
        tmp_path_factory.mktemp("ep"), MOE_ARCHITECTURES, hidden_size=64, num_heads=2, vocab_multiple=8
    )


def test_ep2_gives_dp2_losses_gradients_norm_and_update(moe_paths, tmp_path):
    """Every MoE family with its own routes, and Qwen3-MoE with every token routed to rank 0's experts."""
    import torch.multiprocessing as mp

    cases = [(path, None) for path in moe_paths.values()] + [(moe_paths["qwen3_moe"], [0, 1])]
    out = str(tmp_path / "result")
    mp.spawn(_rank, args=(free_port(), cases, out), nprocs=2, join=True)
    for rank in (0, 1):
        with open(f"{out}.{rank}") as f:
            results = json.load(f)
        assert len(results) == len(cases)
        for r in results:
            dp, ep = r["loss"]
            assert ep == pytest.approx(dp, abs=TOL), r
            assert r["norm"][1] == pytest.approx(r["norm"][0], rel=TOL), r
            assert r["grad_gap"] < TOL, r
            # Adam's first step moves each weight by lr g / (|g| + eps): a gradient near eps turns its rounding
            # into a fraction of lr (1e-2)
            assert r["weight_gap"] < 1e-4, r
            assert r["local_shapes"] and all(shape[0] == 4 for shape in r["local_shapes"].values()), r  # 8 / 2


def test_even_chunks_splits_the_largest_pass_until_the_ranks_agree():
    chunks = [slice(0, 6), slice(6, 8)]
    assert even_chunks(chunks, 2) == chunks
    assert even_chunks(chunks, 3) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert even_chunks(chunks, 4) == [slice(0, 1), slice(1, 3), slice(3, 6), slice(6, 8)]
    with pytest.raises(AssertionError):
        even_chunks([slice(0, 1)], 2)
