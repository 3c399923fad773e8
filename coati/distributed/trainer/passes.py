"""How a consumer's rows become forward passes: the model inputs of a set of rows, their split into passes (rows of
similar length together, whole groups when prompts are shared), the layout each pass takes (``forward.LAYOUTS``) and
the log-probs it yields, with or without gradients."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from coati.distributed.algo import router_losses
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.model import routing
from coati.distributed.model.architectures import is_vision_language
from coati.distributed.record import RolloutBatch
from coati.distributed.trainer import expert_parallel, sequence_parallel
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.engine import Engine
from coati.distributed.trainer.forward import (
    LAYOUTS,
    causal_lm,
    choose_layout,
    pair_cost,
    row_tensors,
    token_budget_chunks,
)

log = logging.getLogger(__name__)


class Passes:
    def __init__(self, engine: Engine, cfg: ConsumerConfig, generation: GenerationConfig, num_generations: int):
        self.engine, self.cfg, self.generation, self.n = engine, cfg, generation, num_generations
        self.routers = routing.routers(engine.model)
        """the policy's MoE routers, in layer order (none: a dense model); each pass's statistics and losses"""
        self.router: routing.RouterStats | None = None
        """the last policy pass's router logits and choices"""
        self.routes = [0, 0]
        """routing replay: (tokens x MoE layers whose own top-k already was the engine's, those replayed) since
        ``route_agreement`` last read them"""
        self.share_prompts = self._can_share_prompts()
        """whether passes compute each group's prompt once (``share_prompt_forward``, where the run allows it)"""
        self.layouts = self._allowed_layouts()
        self.pair_flops = pair_cost(engine.model)

    def _can_share_prompts(self) -> bool:
        """Whether micro-batches compute each group's prompt once (see ``share_prompt_forward``); says why not."""
        if not self.cfg.share_prompt_forward:
            return False
        size = self.cfg.train_microbatch_size or self.n
        reason = (
            "pipeline stages pass hidden states, not caches"
            if self.cfg.plugin.pp_size > 1
            else "routing replay routes each row's own columns"
            if self.cfg.routing_replay
            else "a mixture of experts' router statistics and losses count each row's own tokens"
            if self.routers
            else "gradient checkpointing recomputes layers without their KV cache, and packing needs SDPA attention"
            if self.cfg.gradient_checkpointing and not self.engine.sdpa
            else f"train_microbatch_size={size} is not a multiple of num_generations={self.n}"
            if size % self.n
            else ""
        )
        if reason and self.engine.rank == 0:
            log.warning("share_prompt_forward: every row's prompt is computed in full (%s)", reason)
        return not reason

    def _allowed_layouts(self) -> tuple[str, ...]:
        """The forward layouts a micro-batch may take (``forward.LAYOUTS``; ``choose_layout`` picks among them)."""
        if not self.share_prompts:
            return ("rows",)
        # The recompute keeps no KV cache; sequence parallelism splits whole rows (a cache's responses are not)
        cache = () if self.cfg.gradient_checkpointing or self.cfg.plugin.sp_size > 1 else ("prompt_cache",)
        # a vision-language model places its image tokens by its own positions and masks, which packing replaces
        packed = self.engine.sdpa and not is_vision_language(causal_lm(self.engine.model).config)
        return ("rows", *cache, *(("packed",) if packed else ()))

    def tensors(self, batch: RolloutBatch, rows, trim: bool = True) -> dict[str, torch.Tensor]:
        """The model inputs of ``rows``; with ``trim``, without the columns that are padding in all of them."""
        return row_tensors(batch, rows, self.engine.device, trim, routes=self.replays(batch))

    def replays(self, batch: RolloutBatch) -> bool:
        """Whether this batch's rows are routed as the engine routed them (``routing_replay``)."""
        if self.cfg.routing_replay and batch.prompt_routes is None:
            raise ValueError("routing_replay is on, but the batch carries no routes: its engine recorded none")
        return self.cfg.routing_replay

    def router_loss(self, weight: float, metrics) -> torch.Tensor | None:
        """The last policy pass's router losses (load balancing, z-loss; ``algo/router_losses``), averaged over its
        MoE layers and weighed by their coefficients and by ``weight`` (the pass's share of the minibatch), for the
        loss; None when neither is weighed. Records each layer's expert load and router entropy and both losses in
        ``metrics``, weighted by ``weight``."""
        stats, self.router = self.router, None
        if stats is None or stats.logits[0] is None:
            return None
        layers = list(zip(stats.logits, stats.experts, strict=True))
        lb = torch.stack([router_losses.load_balancing_loss(g, x) for g, x in layers])
        z = torch.stack([router_losses.router_z_loss(g) for g, _ in layers])
        for i, (g, x) in enumerate(layers):
            metrics.add(f"moe/expert_load_layer{i}", router_losses.expert_load(x, g.shape[-1]), weight)
            metrics.add(f"moe/router_entropy_layer{i}", router_losses.router_entropy(g), weight)
        metrics.add("moe/load_balancing_loss", float(lb.mean()), weight)
        metrics.add("moe/router_z_loss", float(z.mean()), weight)
        a, b = self.cfg.router_aux_loss_coef, self.cfg.router_z_loss_coef
        return weight * (a * lb.mean() + b * z.mean()) if a or b else None

    def route_agreement(self) -> tuple[float, int] | None:
        """(the share of replayed tokens x MoE layers whose own top-k set was already the engine's, how many were
        replayed) since the last call; None when none were."""
        agreed, replayed = self.routes
        self.routes = [0, 0]
        return (agreed / replayed, replayed) if replayed else None

    def chunks(self, batch: RolloutBatch, rows) -> list[slice]:
        """``rows`` (in their order) split into forward/backward passes: ``train_microbatch_size`` rows each, or as
        many whole groups as fit in ``train_microbatch_tokens``; with expert parallelism, as many as the EP group's
        other ranks make (collective over it)."""
        size = self.cfg.train_microbatch_size
        if size:
            chunks = [slice(lo, lo + size) for lo in range(0, len(rows), size)]
        else:
            chunks = token_budget_chunks(
                batch.prompt_mask[rows].sum(-1),
                batch.response_lengths[rows],
                self.n if self.share_prompts else 1,
                self.cfg.train_microbatch_tokens,
                self.share_prompts,
            )
        group = self.engine.ep_group
        if group is None:
            return chunks
        # Each pass's all-to-alls pair the EP ranks: every rank makes as many passes as the one that makes most.
        return expert_parallel.even_chunks(chunks, expert_parallel.agreed_count(len(chunks), group))

    def by_length(self, batch: RolloutBatch, shard_rows, local) -> np.ndarray:
        """``local`` (indices into the shard) ordered by token count, so each micro-batch holds rows of similar
        length and pads little; whole groups move together when prompts are shared. The loss is normalised over
        the whole minibatch, so the grouping changes no value."""
        rows = shard_rows[local]
        tokens = batch.prompt_mask[rows].sum(-1) + batch.response_lengths[rows]
        if not self.share_prompts:
            return local[np.argsort(tokens, kind="stable")]
        groups = local.reshape(-1, self.n)
        return groups[np.argsort(tokens.reshape(-1, self.n).max(-1), kind="stable")].reshape(-1)

    def layout(self, t: dict) -> str:
        """The layout ``choose_layout`` picks for a pass's inputs."""
        return choose_layout(
            t["prompt_mask"].sum(-1).numpy(force=True),
            t["response_mask"].sum(-1).numpy(force=True),
            self.n,
            self.pair_flops,
            self.layouts,
        )

    def logprobs(self, model, t: dict, with_entropy: bool = False, layout: str | None = None):
        """Per-token log-probs (and entropy) of a micro-batch's inputs, under the configured precision, in ``layout``
        (None: the one ``layout`` picks)."""
        t = dict(t)
        routes = t.pop("routes", None)
        layout = layout or self.layout(t)
        group = {} if layout == "rows" else {"group_size": self.n}
        assert routes is None or layout == "rows", layout
        # The policy's passes only: the reference is another model, routed by its own router.
        policy = model is self.engine.model
        layers = self.routers if policy else []
        real = torch.cat([t["prompt_mask"], t["response_mask"]], dim=1) if layers else None
        sp = self.engine.sp_group if policy else None
        with (
            self.engine.compute(),
            sequence_parallel.split(causal_lm(model), sp) if sp is not None else contextlib.nullcontext(),
            routing.replay(layers, routes if policy else None) as replay,
            routing.router_stats(layers, real) as stats,
        ):
            out = LAYOUTS[layout](
                model,
                **t,
                **group,
                temperature=self.generation.temperature,
                with_entropy=with_entropy,
                vocab_size=self.engine.vocab_size,
            )
        if policy:
            self.router = stats
        if replay is not None:
            self.routes[0] += replay.agreed
            self.routes[1] += replay.replayed
        return out

    @torch.no_grad()
    def logprobs_no_grad(self, model, batch: RolloutBatch, rows) -> torch.Tensor:
        """[len(rows), R] log-probs of ``rows`` under ``model``, in passes, without gradients."""
        out = []
        for chunk in self.chunks(batch, rows):
            t = self.tensors(batch, rows[chunk])
            lp, _ = self.logprobs(model, t)
            out.append(torch.nn.functional.pad(lp, (0, batch.response_ids.shape[1] - lp.shape[1])))
        return torch.cat(out)

    def old_logprobs(self, batch: RolloutBatch, shard_rows, mb_rows: int) -> torch.Tensor:
        """The shard's log-probs before this step's first update, as the first pass's ratios need them. Only the rows
        after the first minibatch take a forward of their own here: the first minibatch's forward with gradients
        runs before any update and writes its rows (the step's ``first`` micro-batches)."""
        old = torch.zeros(len(shard_rows), batch.response_ids.shape[1], device=self.engine.device)
        if len(shard_rows) > mb_rows:
            old[mb_rows:] = self.logprobs_no_grad(self.engine.model, batch, shard_rows[mb_rows:])
        return old

    def rollout_logprobs(self, batch: RolloutBatch, rows, width: int | None = None):
        """The engines' log-probs of ``rows`` (None where any of them is not valid for the sampling settings)."""
        valid = batch.extras.get("logprobs_valid")
        if valid is not None and not np.all(valid[rows]):
            return None
        return torch.from_numpy(batch.rollout_logprobs[rows][:, :width]).to(self.engine.device)
