"""ColossalAI 0.5.0 shardformer policy for decoder-only language models under transformers 5.x, handed to
``HybridParallelPlugin(custom_policy=...)`` by the consumer. It replaces colossalai's own Llama and Qwen2 policies,
which cannot be used on transformers 5:

1. They do not import: ``colossalai.shardformer.modeling.llama`` imports ``StaticCache`` from ``modeling_llama`` and
   the Qwen2 policy imports ``Qwen2FlashAttention2``/``Qwen2SdpaAttention``; transformers 5 removed all three.
2. Their model forwards (installed in every mode, pipeline or not) call decoder layers with transformers 4's
   positional arguments and return 4.x tuples (``DecoderLayer.forward() takes from 2 to 7 positional arguments but 9
   were given``).

What this policy does instead, for any model laid out as ``model.embed_tokens``, ``model.layers[i].self_attn.
{q,k,v,o}_proj``, ``model.layers[i].mlp.{gate,up,down}_proj``, ``model.norm``, ``model.rotary_emb``, ``lm_head``
(Llama, Qwen2, Qwen3, Mistral):

- tensor parallelism: q/k/v and gate/up split by output columns, o and down by input rows, the embedding and the LM
  head split over the (padded) vocabulary, the LM head's output gathered (a critic's one-output value head, ``score``,
  stays whole on every rank: its input, the final norm's output, is whole there). transformers 5's attention reshapes
  with ``-1`` heads, so a shard's attention needs no attribute rewrites.
- pipeline parallelism: each stage holds its slice of the layers (the first also the embedding, the last the final
  norm and the LM head), and ``stage_forward`` below runs that slice with transformers 5's own mask and rotary code.
- expert parallelism (the MoE plugin's EP group, ``shard_config.ep_group``): each MoE layer's fused experts become
  this rank's ``expert_parallel.ExpertShard``.
- otherwise the model keeps transformers' own forward: data parallelism and ZeRO change nothing in it.
"""

from __future__ import annotations

from functools import partial

import torch
from colossalai.shardformer.layer import Linear1D_Col, Linear1D_Row, VocabParallelEmbedding1D, VocabParallelLMHead1D
from colossalai.shardformer.policies.base_policy import ModulePolicyDescription, Policy
from colossalai.shardformer.policies.base_policy import SubModuleReplacementDescription as Replace
from torch import nn

from coati.distributed.trainer.expert_parallel import gather_experts, is_expert, shard_experts

COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj", "mlp.down_proj")


class DecoderLMPolicy(Policy):
    """Tensor and pipeline parallel sharding of a transformers 5 decoder-only causal LM (see the module docstring)."""

    def config_sanity_check(self):
        if not self.shard_config.enable_tensor_parallelism and self.pipeline_stage_manager is None:
            return  # data parallelism and ZeRO keep the model as it is (a peft model included)
        model = self.model
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        head = hasattr(model, "lm_head") or (hasattr(model, "score") and self.pipeline_stage_manager is None)
        if inner is None or not all(hasattr(inner, a) for a in needed) or not head:
            raise ValueError(
                f"{type(model).__name__} is not laid out as a decoder-only LM (model.embed_tokens, model.layers, "
                f"model.norm, model.rotary_emb, lm_head, or a critic's score head without pipeline stages); coati's "
                "ColossalAI policy supports Llama, Qwen2, Qwen3 and "
                f"Mistral-style models"
            )
        layer = inner.layers[0]
        missing = [s for s in COLUMN + ROW if _submodule(layer, s) is None]
        if missing and self.shard_config.enable_tensor_parallelism:
            raise ValueError(f"tensor parallelism needs {missing} in each layer of {type(model).__name__}")
        tp = self.shard_config.tensor_parallel_size
        cfg = model.config
        if self.shard_config.enable_tensor_parallelism and (
            cfg.num_attention_heads % tp or cfg.num_key_value_heads % tp
        ):
            raise ValueError(
                f"tp_size={tp} must divide the attention heads ({cfg.num_attention_heads}) and key/value heads "
                f"({cfg.num_key_value_heads}) of {type(model).__name__}; use a tp_size that divides both"
            )

    def preprocess(self) -> nn.Module:
        self.tie_weight = self.tie_weight_check()
        return self.model

    def postprocess(self) -> nn.Module:
        if self.shard_config.enable_tensor_parallelism:
            sum_partial_grads(self.model, self.shard_config.tensor_parallel_process_group)
        ep_group = getattr(self.shard_config, "ep_group", None)
        if ep_group is not None and ep_group.size() > 1:
            if not shard_experts(self.model, ep_group):
                raise ValueError(f"ep_size={ep_group.size()}, but {type(self.model).__name__} has no fused experts")
        return self.model

    def module_policy(self) -> dict:
        policy: dict = {}
        shard = self.shard_config
        model = self.model
        if shard.enable_tensor_parallelism:
            layer_cls = type(model.model.layers[0])
            policy[layer_cls] = ModulePolicyDescription(
                sub_module_replacement=[Replace(suffix=s, target_module=Linear1D_Col) for s in COLUMN]
                + [Replace(suffix=s, target_module=Linear1D_Row) for s in ROW]
            )
            vocab = {"make_vocab_size_divisible_by": shard.make_vocab_size_divisible_by}
            scaled = hasattr(model.model.embed_tokens, "scalar_embed_scale")  # Gemma's sqrt(hidden) scaling
            embedding = Replace(
                suffix="embed_tokens",
                kwargs=vocab,
                target_module=ScaledVocabParallelEmbedding1D if scaled else VocabParallelEmbedding1D,
            )
            head = Replace(
                suffix="lm_head",
                target_module=VocabParallelLMHead1D,
                kwargs={**vocab, "gather_output": not shard.parallel_output},
            )
            policy[type(model.model)] = ModulePolicyDescription(sub_module_replacement=[embedding])
            if hasattr(model, "lm_head"):  # a critic's value head (score, one output) stays whole on every rank
                policy[type(model)] = ModulePolicyDescription(sub_module_replacement=[head])
        stages = self.pipeline_stage_manager
        if stages is not None:
            start, end = stages.get_stage_index(stages.distribute_layers(len(model.model.layers)))
            forward = partial(stage_forward, stage_manager=stages, stage_index=(start, end))
            self.append_or_create_method_replacement({"forward": forward}, policy, type(model))
        return policy

    def get_held_layers(self) -> list[nn.Module]:
        stages = self.pipeline_stage_manager
        inner = self.model.model
        start, end = stages.get_stage_index(stages.distribute_layers(len(inner.layers)))
        held = [inner.rotary_emb]
        if stages.is_first_stage():
            held.append(inner.embed_tokens)
        held.extend(inner.layers[start:end])
        if stages.is_last_stage():
            held += [inner.norm, self.model.lm_head]
        return held

    def get_shared_params(self) -> list[dict[int, torch.Tensor]]:
        """A tied embedding/LM head lives on the first and the last stage; the plugin keeps the two copies equal."""
        stages = self.pipeline_stage_manager
        if stages is None or stages.num_stages == 1 or not self.tie_weight:
            return []
        return [{0: self.model.model.embed_tokens.weight, stages.num_stages - 1: self.model.lm_head.weight}]


class ScaledVocabParallelEmbedding1D(VocabParallelEmbedding1D):
    """The vocabulary-parallel embedding of a model whose embedding scales its output (Gemma's
    ``ScaledWordEmbedding``: x sqrt(hidden_size), in the weights' dtype); a plain one would drop the scale."""

    @staticmethod
    def from_native_module(module: nn.Module, process_group, *args, **kwargs) -> nn.Module:
        parallel = VocabParallelEmbedding1D.from_native_module(module, process_group, *args, **kwargs)
        parallel.__class__ = ScaledVocabParallelEmbedding1D
        parallel.embed_scale = float(module.scalar_embed_scale)
        return parallel

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        return super().forward(input_) * torch.tensor(self.embed_scale, dtype=self.weight.dtype)


def sum_partial_grads(model: nn.Module, group) -> list[str]:
    """Under tensor parallelism each rank holds some heads: a replicated weight applied per head after the column
    split (Qwen3's and Gemma 3's q_norm/k_norm) gets from each rank only its heads' share of the gradient, and the
    ranks' copies would drift apart. Sum those shares over the TP group as each gradient is computed; returns the
    names of the weights so treated."""
    import torch.distributed as dist

    def summed(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=group)
        return grad

    names = []
    for i, layer in enumerate(model.model.layers):
        for block in ("self_attn", "mlp"):
            parent = getattr(layer, block, None)
            if parent is None:
                continue
            split = {
                id(p)
                for s in COLUMN + ROW
                if s.startswith(block + ".")
                for p in (_submodule(layer, s) or nn.Module()).parameters()
            }
            for name, param in parent.named_parameters():
                if id(param) not in split and param.requires_grad:
                    param.register_hook(summed)
                    names.append(f"model.layers.{i}.{block}.{name}")
    return names


def gathered_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """A sharded module's full weights under their Hugging Face names (each tensor-parallel shard gathered, the
    vocabulary padding TP adds dropped: the producers' models have the real size; each expert-parallel layer's
    experts gathered); collective over the TP and EP groups."""
    from colossalai.checkpoint_io.utils import gather_distributed_param
    from colossalai.tensor.padded_tensor import is_padded_tensor

    out = {}
    for name, param in module.named_parameters():
        if is_expert(param):
            out[name] = gather_experts(param)
            continue
        full = gather_distributed_param(param, keep_vars=False).detach()
        if is_padded_tensor(param):
            full = full.narrow(param._padding_dim, 0, param._origin_length)
        out[name] = full
    return out


def stage_forward(
    self,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    hidden_states: torch.Tensor | None = None,
    logits_to_keep: int = 0,
    stage_manager=None,
    stage_index: tuple[int, int] = (0, 0),
    **_unused_hf_kwargs,
):
    """One pipeline stage of a causal LM: token ids (first stage) or the previous stage's ``hidden_states`` [B, T, H]
    through layers ``stage_index``; returns ``{"hidden_states"}`` for the next stage, or, on the last stage, a
    ``CausalLMOutputWithPast`` whose logits [B, T or logits_to_keep, V] cover the last ``logits_to_keep`` positions
    (all when 0). ``attention_mask``/``position_ids`` reach every stage with the micro-batch."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    from transformers.modeling_outputs import CausalLMOutputWithPast

    inner, config = self.model, self.config
    if stage_manager.is_first_stage():
        hidden_states = inner.embed_tokens(input_ids)
    if position_ids is None:
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
    mask_kwargs = dict(
        config=config,
        inputs_embeds=hidden_states,
        attention_mask=attention_mask,
        past_key_values=None,
        position_ids=position_ids,
    )
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    masks = {"full_attention": create_causal_mask(**mask_kwargs)}
    if "sliding_attention" in layer_types:
        masks["sliding_attention"] = create_sliding_window_causal_mask(**mask_kwargs)
    rotary = inner.rotary_emb(hidden_states, position_ids)
    start, end = stage_index
    for i in range(start, end):
        hidden_states = inner.layers[i](
            hidden_states, attention_mask=masks[layer_types[i]], position_embeddings=rotary, position_ids=position_ids
        )
    if not stage_manager.is_last_stage():
        return {"hidden_states": hidden_states}
    hidden_states = inner.norm(hidden_states)
    if logits_to_keep:
        hidden_states = hidden_states[:, -logits_to_keep:]
    return CausalLMOutputWithPast(logits=self.lm_head(hidden_states))


def _submodule(module: nn.Module, dotted: str) -> nn.Module | None:
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module
