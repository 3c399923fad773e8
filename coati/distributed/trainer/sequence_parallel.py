"""Sequence parallelism in ColossalAI's ``all_to_all`` mode (DeepSpeed-Ulysses) for the trainer's forward passes.

The ranks of an SP group (ColossalAI's ``sp_group``; they share one data-parallel shard) take a pass's rows together
and split each row's columns: rank i holds columns [i T/n, (i + 1) T/n) (the row padded to a multiple of n). Every
layer but attention works on its own columns. Attention exchanges by all-to-all: queries, keys and values go from
(all heads, own columns) to (heads [i H/n, (i + 1) H/n), all columns), attention runs there under the pass's whole
mask, and its output comes back the other way. The decoder's final hidden states are gathered, so the trainer's loss
code sees whole rows on every rank.

Gradients: each rank's weights receive the share of its own columns (and its heads' share of attention), the
output layer the whole rows'. The gather's backward hands each rank its columns' gradient times n, so that
ColossalAI's data-parallel mean over DP x SP ranks (``mixed_dp_group``, torch DDP or ZeRO) gives the gradient of the
data-parallel run (``tests/component/test_sequence_parallel.py``).

- ``use`` installs the exchanging attention (``NAME``) around the model's own (SDPA, coati's CPU SDPA or eager).
- ``split`` (a context) splits a forward's inputs and hands the whole boolean mask [B, 1, T, T] to every layer as a
  4D mask (transformers passes those on unchanged, so a recompute under gradient checkpointing sees it too); rows
  laid out as padded rows (a 2D mask) or as packed groups (a 4D tree mask) alike.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

NAME = "coati_ulysses"

_inner: dict[int, str] = {}
"""per model config (id): the attention implementation the exchange wraps"""
_groups: dict[int, object] = {}
"""per model config (id): its SP group"""


def use(model: nn.Module, group) -> None:
    """Make ``model``'s attention exchange over ``group`` inside ``split``; outside it, attention is as before."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    if config._attn_implementation == NAME:
        return
    _inner[id(config)], _groups[id(config)] = config._attn_implementation, group
    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)


def attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention signature. A call whose mask covers n times its queries' columns is one of ``split``'s
    (its queries are this rank's columns): exchanged, computed over all columns, exchanged back. Others run the
    wrapped attention as they are."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = module.config
    name, group = _inner[id(config)], _groups[id(config)]
    inner = (
        ALL_ATTENTION_FUNCTIONS[name]
        if name != "eager"
        else sys.modules[type(module).__module__].eager_attention_forward
    )
    n = dist.get_world_size(group)
    if attention_mask is None or attention_mask.shape[-2] != n * query.shape[2]:
        return inner(module, query, key, value, attention_mask, **kwargs)
    mask = attention_mask
    window = kwargs.get("sliding_window")
    if window:  # by positions: along a packed row's tree, as along a padded row
        local = kwargs.get("position_ids")
        positions = _gather_columns(local, group) if local is not None else None
        if positions is not None:
            mask = mask & ((positions[:, None, :, None] - positions[:, None, None, :]) < window)
    if name == "eager":  # eager attention adds its mask
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~mask, torch.finfo(query.dtype).min
        )
    q, k, v = (_heads_to_columns(x, group, n) for x in (query, key, value))
    out, _ = inner(module, q, k, v, mask, **kwargs)
    return _columns_to_heads(out, group, n), None


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    """Block j of ``x``'s first dimension to rank j, rank j's block i back in block j (differentiable)."""
    from torch.distributed.nn.functional import all_to_all_single

    x = x.contiguous()
    return all_to_all_single(torch.empty_like(x), x, group=group)


def _heads_to_columns(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """[B, h, t, D] (all heads, own columns) -> [B, h / n, n t, D] (own heads, all columns)."""
    b, h, t, d = x.shape
    got = _exchange(x.reshape(b, n, h // n, t, d).transpose(0, 1), group)  # [n (column block), B, h / n, t, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * t, d)


def _columns_to_heads(y: torch.Tensor, group, n: int) -> torch.Tensor:
    """Attention output [B, n t, h / n, D] (own heads, all columns) -> [B, t, h, D] (all heads, own columns)."""
    b, cols, h, d = y.shape
    t = cols // n
    got = _exchange(y.reshape(b, n, t, h, d).transpose(0, 1), group)  # [n (head block), B, t, h / n, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, t, n * h, d)


def _gather_columns(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's columns of ``x`` [B, t, ...], in rank order (no gradient)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


class _GatherColumns(torch.autograd.Function):
    """Forward: all ranks' columns [B, n t, H]. Backward: this rank's columns' gradient, times n (module docstring)."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        ctx.group, ctx.t = group, local.shape[1]
        return _gather_columns(local, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        rank, n = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad[:, rank * ctx.t : (rank + 1) * ctx.t] * n, None


def whole_mask(attention_mask: torch.Tensor | None, batch: int, cols: int, device) -> torch.Tensor:
    """The boolean mask [B, 1, T, T] a forward of ``cols`` columns computes under: a 4D mask as given, a 2D
    padding mask [B, T] (1: real) made causal, or causal; every position attends at least to itself (a padding
    query then attends to something, and no NaN reaches the backward)."""
    ar = torch.arange(cols, device=device)
    causal = ar[:, None] >= ar[None, :]
    if attention_mask is None:
        mask = causal[None, None].expand(batch, 1, cols, cols)
    elif attention_mask.ndim == 4:
        mask = attention_mask.bool()
    else:
        mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
    return mask | torch.eye(cols, dtype=torch.bool, device=device)


@contextmanager
def split(model: nn.Module, group):
    """Within the block, each forward of ``model`` (a causal LM set up by ``use``) runs on this rank's columns of its
    inputs (``input_ids``, ``attention_mask`` 2D or 4D, ``position_ids``), and its decoder returns the whole rows'
    final hidden states; collective over ``group``."""
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    cols: list[int] = []

    def take_columns(module, args, kwargs):
        ids = kwargs["input_ids"]
        b, t = ids.shape
        pad = (-t) % n
        mask = whole_mask(kwargs.get("attention_mask"), b, t, ids.device)
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(t, device=ids.device).expand(b, t)
        if pad:  # padding columns attend to themselves only
            padded = torch.eye(t + pad, dtype=torch.bool, device=ids.device).repeat(b, 1, 1, 1)
            padded[:, :, :t, :t] = mask
            mask = padded
            ids, positions = nn.functional.pad(ids, (0, pad)), nn.functional.pad(positions, (0, pad))
        width = (t + pad) // n
        own = slice(rank * width, (rank + 1) * width)
        cols.append(t)
        return args, {**kwargs, "input_ids": ids[:, own], "position_ids": positions[:, own], "attention_mask": mask}

    def whole_rows(module, args, out):
        out.last_hidden_state = _GatherColumns.apply(out.last_hidden_state, group)[:, : cols.pop()]
        return out

    hooks = [
        model.register_forward_pre_hook(take_columns, with_kwargs=True),
        model.get_decoder().register_forward_hook(whole_rows),
    ]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
