"""A consumer's weights as the producers and the driver receive them: pushes over the weight group (full weights in
the engines' dtype, or a LoRA adapter), each with the fingerprints of what it sent; the weights or adapter on CPU."""

from __future__ import annotations

import time

import torch

from coati.distributed.model.checkpoint_format import to_checkpoint
from coati.distributed.model.lora import adapter_tensors, merged_state
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.engine import Engine
from coati.distributed.trainer.forward import causal_lm
from coati.distributed.transport import init_group, ray_broadcast_tensor_dict
from coati.distributed.transport.attest import fingerprints, tied_weights, transposed_weights
from coati.distributed.transport.wire_layout import cast_for_wire


class WeightSender:
    def __init__(self, engine: Engine, cfg: ConsumerConfig):
        self.engine, self.cfg = engine, cfg
        self.group: str | None = None
        """the weight group this rank sends on (None: it sends nothing)"""
        self.wire_dtype: torch.dtype | None = None
        """the dtype full pushes travel in; None: the weights' own"""
        self._layout: tuple[dict[str, str], frozenset[str]] | None = None

    def join(self, world_size: int, group_name: str, backend: str, timeout_s: float, wire_dtype: str | None) -> None:
        """Join ``group_name`` as its sender; full pushes then travel in ``wire_dtype`` (the engines' weight dtype,
        e.g. "bfloat16"; None: the trainer's own dtypes)."""
        init_group(world_size, 0, group_name, backend=backend, timeout_s=timeout_s)
        self.group = group_name
        self.wire_dtype = getattr(torch, wire_dtype) if wire_dtype else None

    def push(self, version: int) -> dict:
        """Senders broadcast their stage's weights to the producers; every rank takes part in the TP gather. Returns
        the push's seconds and, from a sender of full weights, the fingerprints of what it sent (``attest``: each
        tensor as it travelled, and the weights tied to them) for the driver to compare with what engines hold."""
        start = time.perf_counter()
        if self.cfg.lora_rank:
            state = adapter_tensors(self._named())
        else:
            state = cast_for_wire(self.full_state_dict(), self.wire_dtype)  # a non-sender's is None
        if self.group is not None:
            ray_broadcast_tensor_dict(state, 0, self.engine.device, self.group, version=version)
        sent = None
        if self.group is not None and state is not None:
            # In the checkpoint's layout, as every engine reports what it holds (a MoE's experts one by one).
            shown = state if self.cfg.lora_rank else to_checkpoint(causal_lm(self.engine.model), state)
            sent = fingerprints(shown, version, *self.layout())
        return {"seconds": time.perf_counter() - start, "fingerprints": sent}

    def layout(self) -> tuple[dict[str, str], frozenset[str]]:
        """(the weights tied to others, those stored transposed) that full pushes' fingerprints follow (``attest``);
        none for an adapter's."""
        if self.cfg.lora_rank:
            return {}, frozenset()
        if self._layout is None:
            config = causal_lm(self.engine.model).config
            self._layout = tied_weights(config), transposed_weights(config)
        return self._layout

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (TP-gathered) weights under the Hugging Face names; collective over the TP group."""
        from coati.distributed.trainer.colossal_policy import gathered_weights  # deferred: imports ColossalAI

        return gathered_weights(self.engine.model.unwrap())

    def adapter(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter's tensors on CPU, under the names a push carries."""
        return {k: v.cpu().clone() for k, v in adapter_tensors(self._named()).items()}

    def weights(self) -> dict[str, torch.Tensor]:
        """This stage's full weights on CPU (all stages' when pp_size == 1), with a LoRA adapter merged in;
        collective over TP."""
        if self.cfg.lora_rank:
            return {k: v.cpu().clone() for k, v in merged_state(self._named(), self.cfg.lora_scale).items()}
        return {k: v.cpu().clone() for k, v in self.full_state_dict().items()}

    def _named(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.engine.model.unwrap(unwrap_peft=False).named_parameters()}  # peft's
