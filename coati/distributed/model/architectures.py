"""Which model families coati trains under which layout, read from a model folder's ``config.json`` before any actor
starts: a combination that is not known to train correctly is refused with the reason and the alternative, never
run on diverging weights.

- Data parallelism (and ZeRO, LoRA) keep transformers' own forward: any causal LM whose logits are its output layer
  applied to its final hidden states (checked by the consumer on a probe).
- Tensor parallelism shards through ``colossal_policy.DecoderLMPolicy``: the families in ``TP_FAMILIES``, each
  checked in the suite against the whole model under two ranks (``tests/component/test_architectures.py``).
- Pipeline parallelism runs ``colossal_policy.stage_forward``: the families in ``PP_FAMILIES``.
- Rollout backends check what their engines refuse (vLLM's CPU attention and its head sizes) in
  ``InferenceBackend.check_model``.
"""

from __future__ import annotations

import json
from pathlib import Path

TP_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"})
"""``model_type`` values whose tensor-parallel training matches the whole model's (q/k/v, gate/up, o, down split
Megatron-style; per-head norms' gradients summed over the TP group; Gemma's scaled embedding kept)"""
PP_FAMILIES = frozenset({"llama", "qwen2"})
"""``model_type`` values the pipeline-parallel stage forward is tested on"""


def load_config(path: str) -> dict:
    """A model folder's config.json ({} for a hub id not yet on disk)."""
    file = Path(path) / "config.json"
    return json.loads(file.read_text()) if file.exists() else {}


def is_vision_language(config) -> bool:
    """Whether a model reads images: its config (a folder's config.json, or a loaded transformers config) holds a
    vision tower's beside its text model's."""
    if isinstance(config, dict):  # a folder's config.json
        return "vision_config" in config
    return getattr(config, "vision_config", None) is not None  # a loaded transformers config


def auto_model_class(path: str):
    """The transformers Auto class that loads the folder's generative model: ``AutoModelForImageTextToText`` for a
    vision-language model, else ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(load_config(path)) else AutoModelForCausalLM


def model_classes(config) -> dict:
    """transformers' mapping from a config class to its generative model class, for a loaded ``config``: the
    image-text-to-text one for a vision-language model, else the causal-LM one."""
    from transformers.models.auto import modeling_auto

    if is_vision_language(config):
        return modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    return modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING


VISION_TOWERS = ("vision_tower", "visual", "vision_model")
"""the attribute a vision-language family keeps its image encoder under (LLaVA and Gemma 3, Qwen-VL, Idefics3 and
SmolVLM), on the model or its inner model"""


def vision_towers(model) -> list:
    """A vision-language model's image encoders (its projector excluded); none for a text model."""
    out = []
    for holder in (model, getattr(model, "model", None)):
        for name in VISION_TOWERS:
            tower = getattr(holder, name, None) if holder is not None else None
            if tower is not None and all(tower is not t for t in out):
                out.append(tower)
    return out


def model_type(path: str) -> str | None:
    return load_config(path).get("model_type")


def text_config(config: dict) -> dict:
    """The language model's own settings (a multimodal config nests them under ``text_config``)."""
    return {**config, **config.get("text_config", {})} if isinstance(config.get("text_config"), dict) else config


def head_size(config: dict) -> int | None:
    config = text_config(config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden = config.get("hidden_size") or config.get("n_embd")
    heads = config.get("num_attention_heads") or config.get("n_head")
    return hidden // heads if hidden and heads else None


def num_experts(config: dict) -> int:
    """Routed experts per mixture-of-experts layer (0: a dense model)."""
    config = text_config(config)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return config[key]
    return 0


def expert_width(config: dict) -> int | None:
    """A routed expert's intermediate size (Mixtral's experts are its ``intermediate_size``)."""
    config = text_config(config)
    return config.get("moe_intermediate_size") or config.get("intermediate_size") if num_experts(config) else None


def max_positions(config: dict) -> int | None:
    config = text_config(config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_layout(config: dict, where: str, tp_size: int, pp_size: int) -> None:
    """Refuse a parallel layout the model's family is not known to train correctly under, or whose heads it
    cannot split."""
    config = text_config(config)
    family = config.get("model_type")
    name = (config.get("architectures") or [family])[0]
    if tp_size > 1:
        if family not in TP_FAMILIES:
            raise ValueError(
                f"{where} is {name} (model_type {family!r}), which coati's tensor parallelism does not "
                f"cover (it does {', '.join(sorted(TP_FAMILIES))}); use tp_size=1 and more consumers for "
                "data parallelism"
            )
        heads = config.get("num_attention_heads")
        kv = config.get("num_key_value_heads") or heads
        if heads % tp_size or kv % tp_size:
            raise ValueError(
                f"tp_size={tp_size} must divide {where}'s attention heads ({heads}) and key/value heads "
                f"({kv}); use a tp_size that divides both"
            )
    if pp_size > 1 and family not in PP_FAMILIES:
        raise ValueError(
            f"{where} is {name} (model_type {family!r}), which coati's pipeline parallelism does not "
            f"cover (it does {', '.join(sorted(PP_FAMILIES))}); use pp_size=1"
        )


ROUTED_FAMILIES = frozenset({"qwen3_moe", "mixtral", "olmoe", "qwen2_moe"})
"""``model_type`` values whose routers coati records and replays (``model/routing.py``)"""


def known_experts(config: dict, where: str, setting: str, families: frozenset, whose: str, fix: str) -> int:
    """``config``'s routed experts per layer, or a refusal of ``setting`` naming ``where`` and ``fix``: for a dense
    model, or a family outside ``families`` ("whose {whose} (it does ...)")."""
    config = text_config(config)
    family, experts = config.get("model_type"), num_experts(config)
    if not experts:
        raise ValueError(f"{setting}, but {where} ({family}) has no routed experts; {fix}")
    if family not in families:
        raise ValueError(
            f"{setting}, but {where} is a {family} mixture of experts, whose {whose} (it does "
            f"{', '.join(sorted(families))}); {fix}"
        )
    return experts


def check_routing(config: dict, where: str) -> None:
    """Refuse routing replay for a model it cannot route: a dense one, or a family whose router it does not know."""
    known_experts(
        config, where, "routing_replay=True", ROUTED_FAMILIES, "router coati does not replay", "turn routing_replay off"
    )


EP_FAMILIES = ROUTED_FAMILIES
"""``model_type`` values whose experts coati shards for expert parallelism (fused ``gate_up_proj``/``down_proj``
tensors with one router per layer, ``trainer/expert_parallel.py``)"""


def check_experts(config: dict, where: str, ep_size: int) -> None:
    """Refuse expert parallelism for a model it cannot shard: a dense one, an unknown expert layout, or experts
    that do not split evenly over ``ep_size`` ranks."""
    if ep_size == 1:
        return
    setting = f"ep_size={ep_size}"
    experts = known_experts(config, where, setting, EP_FAMILIES, "experts coati does not shard", "use ep_size=1")
    if experts % ep_size:
        raise ValueError(
            f"ep_size={ep_size} must divide {where}'s {experts} experts per layer; use an ep_size that divides it"
        )


SP_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "gpt2"})
"""``model_type`` values whose sequence-parallel forward (``trainer/sequence_parallel.py``) matches the whole model's,
each checked in the suite (``tests/component/test_sequence_parallel.py``)"""


def check_sequence(config: dict, where: str, sp_size: int) -> None:
    """Refuse sequence parallelism for a family it is not tested on, or whose attention heads it cannot split."""
    if sp_size == 1:
        return
    config = text_config(config)
    family = config.get("model_type")
    if family not in SP_FAMILIES:
        raise ValueError(
            f"sp_size={sp_size}, but {where} is {family}, which coati's sequence parallelism does not cover (it does "
            f"{', '.join(sorted(SP_FAMILIES))}); use sp_size=1"
        )
    heads = config.get("num_attention_heads") or config.get("n_head")
    kv = config.get("num_key_value_heads") or heads
    if heads % sp_size or kv % sp_size:
        raise ValueError(
            f"sp_size={sp_size} must divide {where}'s attention heads ({heads}) and key/value heads ({kv}): attention "
            "exchanges heads for columns; use an sp_size that divides both"
        )


def check_positions(config: dict, where: str, tokens: int, what: str) -> None:
    """Refuse sequences longer than the model's position table."""
    limit = max_positions(config)
    if limit is not None and tokens > limit:
        raise ValueError(
            f"{what} = {tokens} tokens, but {where} has positions for {limit}; lower max_prompt_tokens "
            "or max_new_tokens"
        )
