"""Routing replay (R3) for mixture-of-experts models: the experts an engine routed each token to, recorded while it
generates, and the trainer's forward made to route those tokens the same way.

A MoE layer's router picks each token's top-k experts from its own logits; an engine and a trainer computing in
different kernels or precisions pick differently for tokens near a tie, and such a token then passes through other
experts in training than it did in sampling: a log-prob gap no weight sync can close. Replay keeps the engine's
choice (the indices) and the trainer's own probabilities for them (softmax of its router logits at those indices,
renormalised over the k where the family renormalises), so the router still gets its gradient.

Routes are int16 ``[rows, tokens, moe_layers, k]`` over prompt + response columns (the record's left-padded prompt
then its right-padded response), -1 where the engine routed nothing (padding, the last sampled token, which is
never fed back): there the trainer routes as it would. Works on transformers 5's routers, whose forward returns
``(logits, scores, indices)``, renormalised over the top k where ``norm_topk_prob`` says so (always for Mixtral):
``architectures.ROUTED_FAMILIES``. Pure torch; no Ray.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers, in layer order."""
    return [m for name, m in model.named_modules() if name.endswith(".gate") and type(m).__name__.endswith("Router")]


class Recorder:
    """Records each router call's top-k indices while a model generates (``with Recorder(model) as rec``): the
    calls of one forward, in layer order, become one [batch, positions, layers, k] block (``blocks``)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.layers = model, routers(model)
        self.blocks: list[np.ndarray] = []
        self._calls: list[torch.Tensor] = []

    def __enter__(self) -> Recorder:
        self._hooks = [r.register_forward_hook(self._hook) for r in self.layers]
        self._pre = self.model.register_forward_pre_hook(self._start, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._flush()
        for h in [*self._hooks, self._pre]:
            h.remove()

    def _start(self, module, args, kwargs) -> None:
        self._flush()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._shape = tuple(ids.shape)

    def _hook(self, module, inputs, output) -> None:
        self._calls.append(output[2].detach().to("cpu", torch.int16))

    def _flush(self) -> None:
        if self._calls:
            b, t = self._shape
            self.blocks.append(torch.stack(self._calls, dim=1).reshape(b, t, len(self.layers), -1).numpy())
        self._calls = []


class Replay:
    """The forward hooks that route each token as ``routes`` says (``replay``), and how often the trainer's own
    choice already agreed (a token and layer agree when its set of k experts is the engine's)."""

    def __init__(self, layers: list[torch.nn.Module], routes: torch.Tensor):
        self.layers, self.routes = layers, routes.reshape(-1, routes.shape[-2], routes.shape[-1])
        self.agreed, self.replayed = 0, 0

    def hook(self, layer: int):
        def replace(module, inputs, output):
            logits, scores, own = output
            forced = self.routes[:, layer].to(own.device, torch.long)
            use = (forced >= 0).all(-1, keepdim=True)
            chosen = torch.where(use, forced, own)
            probs = torch.softmax(logits.float(), dim=-1).gather(-1, chosen)
            if getattr(module, "norm_topk_prob", True):
                probs = probs / probs.sum(-1, keepdim=True)
            same = (own.sort(-1).values == forced.sort(-1).values).all(-1, keepdim=True)
            self.agreed += int((same & use).sum())
            self.replayed += int(use.sum())
            return logits, probs.to(scores.dtype), chosen

        return replace


@contextmanager
def replay(layers: list[torch.nn.Module], routes: torch.Tensor | None):
    """Within the block, a forward through the routers ``layers`` (a model's ``routers``) routes token (row,
    position) of its [rows, positions] input through ``routes[row, position, layer]`` where that is not -1
    (``routes``: [rows, positions, layers, k]); yields the ``Replay`` (None and no hooks without routes)."""
    if routes is None:
        yield None
        return
    assert routes.shape[-2] == len(layers), (tuple(routes.shape), len(layers))
    with _hooked(layers, Replay(layers, routes)) as state:
        yield state


class RouterStats:
    """Each MoE layer's router logits [T, E] and chosen experts [T, k] over the real tokens of one forward
    (``router_stats``), in layer order; a recomputation under gradient checkpointing replaces its layer's entry."""

    def __init__(self, layers: list[torch.nn.Module], real: torch.Tensor):
        self.real = real.reshape(-1).bool()
        self.logits: list[torch.Tensor | None] = [None] * len(layers)
        self.experts: list[torch.Tensor | None] = [None] * len(layers)

    def hook(self, layer: int):
        def keep(module, inputs, output):
            logits, _, chosen = output
            self.logits[layer] = logits[self.real.to(logits.device)]
            self.experts[layer] = chosen[self.real.to(chosen.device)].detach()

        return keep


@contextmanager
def router_stats(layers: list[torch.nn.Module], real: torch.Tensor | None):
    """Within the block, collect the router logits and choices of the routers ``layers`` (a model's ``routers``)
    over the tokens ``real`` marks ([rows, positions] of the forward's input, True on real tokens); yields the
    ``RouterStats`` (None without routers or without ``real``). Enter it inside ``replay`` so it sees the replayed
    choices."""
    if not layers or real is None:
        yield None
        return
    with _hooked(layers, RouterStats(layers, real)) as state:
        yield state


@contextmanager
def _hooked(layers: list[torch.nn.Module], state):
    """``state.hook(i)`` on router ``i``'s forward while the block runs; yields ``state``."""
    hooks = [r.register_forward_hook(state.hook(i)) for i, r in enumerate(layers)]
    try:
        yield state
    finally:
        for h in hooks:
            h.remove()
