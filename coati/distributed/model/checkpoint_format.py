"""A model's weights under the names and layout its checkpoint stores them: what ``save_pretrained`` writes, what
every engine's loader reads, and the layout push attestation fingerprints on both sides.

transformers 5 holds some families' weights otherwise than their checkpoints do. A mixture-of-experts layer keeps its
experts fused, ``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I], where a Qwen3-MoE or OLMoE
checkpoint stores ``experts.<e>.{gate,up,down}_proj.weight`` one matrix per expert and Mixtral's also renames the
block (``block_sparse_moe.experts.<e>.w1/w2/w3``). The conversion is transformers' own (``revert_weight_conversion``,
the mapping ``from_pretrained`` applied, read from the model's class), so a family transformers converts is converted
the same way here. Dense families come back unchanged, the same tensor objects.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def meta_model(config):
    """The generative model of ``config`` (a causal LM, or a vision-language model) on the meta device (no memory):
    what ``to_checkpoint`` needs of a model."""
    from coati.distributed.model.architectures import model_classes

    with torch.device("meta"):
        return model_classes(config)[type(config)](config)


def to_checkpoint(model, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a transformers ``model``'s tensors under its own names, whole or any part of them) under the
    checkpoint's names and layout; unchanged where the family stores them alike. Split experts are views or copies
    of the fused tensors as transformers makes them (values exact)."""
    from transformers.core_model_loading import revert_weight_conversion

    with torch.no_grad():
        return revert_weight_conversion(model, dict(state))
