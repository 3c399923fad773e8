"""Expert parallelism for transformers 5's mixture-of-experts layers, on ColossalAI's ``MoeHybridParallelPlugin``.

The plugin lays out the groups: the data-parallel ranks split into expert-parallel groups of ``ep_size`` ranks
(consecutive ranks), each group's rank i holding experts [i E/ep, (i + 1) E/ep) of every layer; ranks holding the
same experts form a moe_dp group. Its own expert blocks (``EPMixtralSparseMoeBlock`` and kin) index transformers 4's
per-expert modules (``experts[i].w1``), which transformers 5 replaced by one fused tensor per layer
(``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]), so this module shards those tensors instead:

- ``ExpertShard`` stands where a layer's experts module stood, holds its rank's slice of both tensors (the same
  ``Parameter`` objects, narrowed, tagged with the EP group as ColossalAI tags expert tensors) and runs the experts
  over tokens exchanged by all-to-all: each (token, chosen expert) pair goes to the rank that holds the expert, comes
  back computed, and is weighed and summed as transformers' own experts do, in the same order (by expert). The router
  stays whole on every rank, so routing replay and the router statistics see what they see without EP.
- ``ExpertParallelPlugin`` is the MoE plugin without torch DDP, which it cannot use with EP (DDP reduces over one
  group; the plugin refuses), so ``ExpertParallelModule.sync_dp_grads`` averages gradients itself: the experts' over
  their moe_dp group, the rest over the whole DP group, each divided by the DP size (an expert's gradient already
  sums its EP group's tokens). ``expert_grad_norm`` is the clip's norm over all experts (each counted once).
- ``even_chunks`` gives every rank of an EP group the same number of forward passes: each pass's all-to-alls pair
  ranks, so a rank with one pass fewer would leave its peers waiting.
- ``gather_experts``: the full expert tensors for pushes and exports (all-gather over the EP group);
  ``save_experts``/``load_experts``: each rank's experts and their Adam moments in checkpoints.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

EXPERT_TENSORS = ("gate_up_proj", "down_proj")
"""the fused expert tensors ``ExpertShard`` shards (leading dimension: the expert)"""


def moe_blocks(model: nn.Module) -> list[nn.Module]:
    """The MoE blocks of ``model`` whose ``experts`` hold fused expert tensors, in layer order."""
    return [
        module
        for module in model.modules()
        if isinstance(getattr(module, "experts", None), nn.Module)
        and all(isinstance(getattr(module.experts, t, None), nn.Parameter) for t in EXPERT_TENSORS)
    ]


class ExpertShard(nn.Module):
    """One MoE layer's experts on one rank of an EP group: experts [first, first + local) of ``num_experts``; the
    forward takes what transformers' experts take (hidden [T, H], top-k indices and weights [T, k]) and returns the
    weighted sum of the k experts' outputs per token [T, H]; collective over the EP group."""

    def __init__(self, experts: nn.Module, group):
        super().__init__()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.num_experts = experts.num_experts
        assert self.num_experts % size == 0, (self.num_experts, size)
        self.local = self.num_experts // size
        self.first = rank * self.local
        self.group, self.size = group, size
        self.act_fn = experts.act_fn
        for name in EXPERT_TENSORS:
            param = getattr(experts, name)
            param.data = param.data[self.first : self.first + self.local].clone()
            param.ep_group = group  # ColossalAI's mark of an expert tensor (``is_moe_tensor``)
            self.register_parameter(name, param)  # the same object: the optimizer's groups still hold it

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        from torch.distributed.nn.functional import all_to_all_single as exchange  # differentiable

        k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs by expert, tokens ascending within one
        expert = flat[order]
        token = order // k
        send = torch.bincount(expert // self.local, minlength=self.size)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_n, recv_n = send.tolist(), recv.tolist()
        inputs = exchange(
            hidden_states.new_empty(sum(recv_n), hidden_states.shape[-1]),
            hidden_states[token],
            recv_n,
            send_n,
            group=self.group,
        )
        which = torch.empty(sum(recv_n), dtype=expert.dtype, device=expert.device)
        dist.all_to_all_single(which, expert % self.local, recv_n, send_n, group=self.group)  # the holder's index
        outputs = self._experts(inputs, which)
        back = exchange(outputs.new_empty(len(token), outputs.shape[-1]), outputs, send_n, recv_n, group=self.group)
        weighted = back * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add(0, token, weighted.to(hidden_states.dtype))

    def _experts(self, inputs: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
        """Each row of ``inputs`` [N, H] through local expert ``which[row]``: down(act(gate x) * up x)."""
        order = torch.argsort(which, stable=True)
        counts = torch.bincount(which, minlength=self.local).tolist()
        pieces = []
        for j, rows in enumerate(inputs[order].split(counts)):
            if counts[j]:
                gate, up = nn.functional.linear(rows, self.gate_up_proj[j]).chunk(2, dim=-1)
                pieces.append(nn.functional.linear(self.act_fn(gate) * up, self.down_proj[j]))
        if not pieces:  # no token came here: the empty result stays in the graph, whose backward pairs ranks too
            return inputs * 0
        computed = torch.cat(pieces)
        return computed[torch.argsort(order)]


def shard_experts(model: nn.Module, group) -> int:
    """Replace every fused experts module of ``model`` by its ``ExpertShard`` on this rank; returns how many."""
    blocks = moe_blocks(model)
    for block in blocks:
        block.experts = ExpertShard(block.experts, group)
    return len(blocks)


def is_expert(param: torch.Tensor) -> bool:
    return hasattr(param, "ep_group")


def gather_experts(param: torch.Tensor, value: torch.Tensor | None = None) -> torch.Tensor:
    """The whole of an expert tensor (all ranks' experts, in order) from this rank's slice ``param`` (or of
    ``value``, e.g. its gradient, laid out as it is); collective over its EP group. Other tensors come back as they
    are."""
    value = (param if value is None else value).detach()
    if not is_expert(param):
        return value
    group = param.ep_group
    parts = [torch.empty_like(value) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, value.contiguous(), group=group)
    return torch.cat(parts)


def expert_grad_norm(grads: list[torch.Tensor], experts: list[torch.Tensor], ep_group, norm) -> float:
    """The global gradient norm with EP: ``norm`` (a norm over a list of gradients) of the replicated ``grads``,
    combined with the experts' (``experts``: this rank's expert gradients) summed over the EP group, where each
    expert lives on one rank."""
    own = torch.tensor([norm(experts) ** 2], dtype=torch.float64)  # norm([]) is 0
    dist.all_reduce(own, group=ep_group)
    return float((norm(grads) ** 2 + own.item()) ** 0.5)


def even_chunks(chunks: list[slice], count: int) -> list[slice]:
    """``chunks`` (consecutive slices) split until there are ``count``: the one with the most rows halved each time
    (its rows stay in order). Needs ``count`` <= the rows."""
    chunks = list(chunks)
    while len(chunks) < count:
        i = max(range(len(chunks)), key=lambda j: chunks[j].stop - chunks[j].start)
        lo, hi = chunks[i].start, chunks[i].stop
        assert hi - lo > 1, ("cannot split a pass of one row", chunks, count)
        mid = lo + (hi - lo) // 2
        chunks[i : i + 1] = [slice(lo, mid), slice(mid, hi)]
    return chunks


def agreed_count(count: int, group) -> int:
    """The most passes any rank of ``group`` makes."""
    n = torch.tensor([count])
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    return int(n.item())


def save_experts(model: nn.Module, optimizer, path: str) -> None:
    """This rank's expert tensors and their optimizer states, to ``path``. ColossalAI's MoE checkpoint writer keys
    tensors by name, and a fused expert tensor has one name on every EP rank: its shards would overwrite each
    other's there, so each rank keeps its own here."""
    state = {
        name: {
            "weight": param.detach().clone(),
            "optimizer": {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer.optim.state[param].items()},
        }
        for name, param in model.named_parameters()
        if is_expert(param)
    }
    torch.save(state, path)


def load_experts(model: nn.Module, optimizer, path: str) -> None:
    """Restore what ``save_experts`` wrote, in place (the flat weight buffers stay)."""
    state = torch.load(path, weights_only=True)
    for name, param in model.named_parameters():
        if is_expert(param):
            param.data.copy_(state[name]["weight"])
            optimizer.optim.state[param].update(state[name]["optimizer"])


def expert_parallel_plugin(**kwargs):
    """ColossalAI's MoE plugin with expert parallelism over ``ep_size`` ranks and no torch DDP (see the module
    docstring); ``kwargs`` as ``MoeHybridParallelPlugin`` takes them."""
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelModule
    from colossalai.booster.plugin.moe_hybrid_parallel_plugin import MoeHybridParallelPlugin
    from colossalai.interface import ModelWrapper

    class ExpertParallelModule(HybridParallelModule):
        """The boosted model; its gradients averaged by ``sync_dp_grads`` after a minibatch's last backward."""

        moe_dp_group = None

        def sync_dp_grads(self):
            params = [p for p in self.module.parameters() if p.requires_grad]
            for p in params:
                if p.grad is None:  # an expert no token reached here: its peers' gradients still arrive
                    p.grad = torch.zeros_like(p)
            size = dist.get_world_size(self.dp_group)
            for group, members in (
                (self.dp_group, [p for p in params if not is_expert(p)]),
                (self.moe_dp_group, [p for p in params if is_expert(p)]),
            ):
                if not members:
                    continue
                flat = torch.cat([p.grad.reshape(-1) for p in members])
                if dist.get_world_size(group) > 1:
                    dist.all_reduce(flat, group=group)
                flat.div_(size)
                for p, g in zip(members, flat.split([p.numel() for p in members]), strict=True):
                    p.grad.copy_(g.view_as(p))

    class ExpertParallelPlugin(MoeHybridParallelPlugin):
        def configure(self, model, optimizer=None, criterion=None, dataloader=None, lr_scheduler=None):
            if not isinstance(model, ModelWrapper):
                model = ExpertParallelModule(
                    module=model,
                    precision=self.precision,
                    shard_config=self.shard_config,
                    dp_group=self.mixed_dp_group,
                    tp_group=self.tp_group,
                    sp_group=self.sp_group,
                    use_ddp=False,
                    ddp_config=self.ddp_config,
                    custom_policy=self.custom_policy,
                )
                model.moe_dp_group = self.moe_dp_group
            return super().configure(model, optimizer, criterion, dataloader, lr_scheduler)

    return ExpertParallelPlugin(**kwargs)
