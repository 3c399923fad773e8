"""GRPOConsumer: the training actor. ColossalAI Booster + HybridParallelPlugin + HybridAdam; algorithm-blind.

Each training step receives the global RolloutBatch of the step (every DP rank gets the same object-store reference),
computes advantages over all of it, keeps its DP shard, and runs ``train_batch_size / train_minibatch_size``
optimizer steps of micro-batched forward/backward passes (``num_iterations`` times over the shard). What the
algorithm is comes only from the AlgorithmConfig fields: estimator, loss, aggregation, KL, masking. Rank 0 pushes the
new weights to the producers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import numpy as np
import torch

from coati.distributed import attention
from coati.distributed.algo import ADVANTAGE_ESTIMATORS, LossInput, LossNorm, compute_policy_loss
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.grouping import without_unscored
from coati.distributed.algo.shaping import mask_truncated
from coati.distributed.attest import fingerprints, tied_weights, transposed_weights
from coati.distributed.guards import all_finite
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.lora import adapter_tensors, merged_state, peft_config
from coati.distributed.placement import whereabouts
from coati.distributed.precision import resolve_compute_dtype
from coati.distributed.record import RolloutBatch, fresh_rows
from coati.distributed.threads import ThreadLease
from coati.distributed.trainer.colossal_cpu import apply_cpu_shims
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.forward import (
    LAYOUTS,
    causal_lm,
    check_output_layer,
    choose_layout,
    pair_cost,
    token_budget_chunks,
    trim_padding,
)
from coati.distributed.trainer.grad_clip import fold_clipping
from coati.distributed.trainer.optimizer_step import OptimizerSteps
from coati.distributed.trainer.pipeline_step import PipelineSteps
from coati.distributed.trainer.step_metrics import StepMetrics
from coati.distributed.transport import init_group, ray_broadcast_tensor_dict
from coati.distributed.transport.wire_layout import cast_for_wire, flatten_parameters, separate_storages

log = logging.getLogger(__name__)


def batch_advantages(batch: RolloutBatch, loss_mask: torch.Tensor, algo) -> torch.Tensor:
    """[B, T] advantages of a batch under ``algo``'s estimator; a completion without a score (its reward function's
    None) is left out of its group's statistics, and its loss mask is empty."""
    group_ids = torch.tensor(batch.group_ids)
    unscored = batch.unscored()
    if unscored.any():
        group_ids = without_unscored(group_ids, torch.tensor(~unscored))
    return ADVANTAGE_ESTIMATORS.get(algo.advantage_estimator)(
        torch.tensor(batch.rewards), group_ids, loss_mask, algo
    ).advantages


class GRPOConsumer(PipelineSteps):
    def __init__(
        self,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        model_path: str,
        consumer: ConsumerConfig,
        algorithm: AlgorithmConfig,
        generation: GenerationConfig,
        num_generations: int,
        seed: int = 0,
    ):
        self.threads = ThreadLease()
        """the cores of the training step in progress, raised by ``set_threads``"""
        self.rank, self.world_size = rank, world_size
        self.master_addr, self.master_port = master_addr, master_port
        self.model_path = model_path
        self.cfg, self.algo, self.generation = consumer, algorithm, generation
        self.n = num_generations
        self.seed = seed
        self.weight_group = None
        self.wire_dtype: torch.dtype | None = None
        """the dtype full pushes travel in (``join_weight_group``); None: the weights' own"""

    def setup(self) -> dict:
        import colossalai
        from colossalai.booster import Booster
        from colossalai.booster.plugin import HybridParallelPlugin
        from colossalai.nn.optimizer import HybridAdam
        from transformers import AutoModelForCausalLM

        from coati.distributed.trainer.colossal_policy import DecoderLMPolicy  # deferred: imports ColossalAI

        on_cpu = apply_cpu_shims()
        backend = "gloo" if on_cpu else "nccl"
        colossalai.launch(
            self.rank, self.world_size, self.master_addr, self.master_port, backend=backend, seed=self.seed
        )
        self.device = torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())
        p = self.cfg.plugin
        self.plugin = HybridParallelPlugin(
            tp_size=p.tp_size,
            pp_size=p.pp_size,
            zero_stage=p.zero_stage,
            precision=p.precision,
            # With clipping off the norm is still measured (every step reports it, and a non-finite one skips the
            # step): a bound no gradient reaches.
            max_norm=self.cfg.max_grad_norm or 1e30,
            num_microbatches=p.pp_num_microbatches if p.pp_size > 1 else None,
            make_vocab_size_divisible_by=p.tp_size,
            enable_metadata_cache=False,
            parallel_output=False,
            custom_policy=DecoderLMPolicy(),
        )
        self.booster = Booster(plugin=self.plugin)
        torch.manual_seed(self.seed)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        model.config.use_cache = False
        attention.use(model, self.device)
        if self.cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        c = self.cfg
        if c.lora_rank:  # peft wraps the model before boosting; only the adapter trains
            lora = peft_config(c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_target_modules, self.model_path)
            model = self.plugin.enable_lora(model, lora_config=lora)
        self.vocab_size = model.config.vocab_size
        # Flat weight buffers, laid out as a transformers producer's: pushes go in a few transfers, received in place.
        # ZeRO's optimizer keeps views of each parameter's storage for its gathers, so there the weights are cast,
        # moved and flattened before boosting (which then leaves them as they are); not with TP or PP, which replace
        # or drop parameters and would leave the old flat buffers alive. Without ZeRO, flattening after boosting
        # keeps only the parameters this rank holds.
        early = p.zero_stage > 0 and p.tp_size == 1 and p.pp_size == 1
        if early:
            model.to(self.device, {"bf16": torch.bfloat16, "fp16": torch.float16}[p.precision])
            flatten_parameters(model)
        trainable = [param for param in model.parameters() if param.requires_grad]
        optimizer = HybridAdam(trainable, lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay)
        self.model, self.optimizer, *_ = self.booster.boost(model, optimizer)
        self.lease_layers = self.threads.follow_layers(self.model)
        self.steps = OptimizerSteps(
            self.optimizer, self.cfg, fold_clipping(self.optimizer, p.tp_size, p.pp_size), self.device, self.world_size
        )
        if p.zero_stage == 0 and not self.cfg.lora_rank:  # an adapter's push is small: no flat layout needed
            flatten_parameters(self.model.unwrap())
        self.dp_rank = self.plugin.dp_group.rank()
        self.dp_size = self.plugin.dp_size
        self.tp_rank = self.plugin.tp_group.rank() if p.tp_size > 1 else 0
        self.pp_rank = self.plugin.stage_manager.stage if p.pp_size > 1 else 0
        self.is_last_stage = p.pp_size == 1 or self.plugin.stage_manager.is_last_stage()
        # The frozen reference is a whole unsharded replica, needed only where the loss is computed (the last
        # pipeline stage).
        self.ref_model = None
        if self.algo.beta > 0 and self.is_last_stage:
            self.ref_model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
            attention.use(self.ref_model, self.device)
            self.ref_model.to(self.device).eval().requires_grad_(False)
            self.lease_layers += self.threads.follow_layers(self.ref_model)  # its forward takes up lends too
        self.step_count = 0
        self._warned_unavailable = False
        if p.pp_size == 1:  # pipeline stages compute the loss from the model's own logits
            check_output_layer(self.model)
        # Packing a group into one row needs a boolean 4D attention mask, which the SDPA attentions take.
        self.attention = getattr(causal_lm(self.model).config, "_attn_implementation", None)
        self.sdpa = self.attention in ("sdpa", attention.NAME)
        self.share_prompts = self._can_share_prompts()
        self.layouts, self.pair_flops = self._allowed_layouts(), pair_cost(self.model)
        self.compute_dtype = resolve_compute_dtype(self.cfg.compute_dtype, self.device, p.precision, p.tp_size)
        if self.rank == 0:
            log.warning(
                "trainer computes in %s (compute_dtype=%s, weights %s)",
                self.compute_dtype,
                self.cfg.compute_dtype,
                p.precision,
            )

        return {
            **whereabouts(),
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
            "device": str(self.device),
            "compute_dtype": self.compute_dtype,
            "gradient_checkpointing": self.model.unwrap(unwrap_peft=False).is_gradient_checkpointing,
            "shares_prompts": self.share_prompts,
            "layouts": self.layouts,
            "lease_layers": self.lease_layers,
            "attention": self.attention,
            "malloc": os.environ.get("GLIBC_TUNABLES", ""),
            "clipping": "in the update" if self.steps.clipping else "colossalai",
        }

    # ---- training --------------------------------------------------------------------------------------------

    def _compute(self):
        """The forward passes' precision: bf16 autocast over the fp32 weights, or nothing."""
        if self.compute_dtype == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _tensors(self, batch: RolloutBatch, rows, trim: bool = True) -> dict[str, torch.Tensor]:
        """The model inputs of ``rows``; with ``trim``, without the columns that are padding in all of them."""
        arrays = {
            name: getattr(batch, name)[rows] for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
        }
        if trim:
            arrays = trim_padding(**arrays)
        return {name: torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for name, a in arrays.items()}

    def _can_share_prompts(self) -> bool:
        """Whether micro-batches compute each group's prompt once (see ``share_prompt_forward``); says why not."""
        if not self.cfg.share_prompt_forward:
            return False
        size = self.cfg.train_microbatch_size or self.n
        reason = (
            "pipeline stages pass hidden states, not caches"
            if self.cfg.plugin.pp_size > 1
            else "gradient checkpointing recomputes layers without their KV cache, and packing needs SDPA attention"
            if self.cfg.gradient_checkpointing and not self.sdpa
            else f"train_microbatch_size={size} is not a multiple of num_generations={self.n}"
            if size % self.n
            else ""
        )
        if reason and self.rank == 0:
            log.warning("share_prompt_forward: every row's prompt is computed in full (%s)", reason)
        return not reason

    def _allowed_layouts(self) -> tuple[str, ...]:
        """The forward layouts a micro-batch may take (``forward.LAYOUTS``; ``choose_layout`` picks among them)."""
        if not self.share_prompts:
            return ("rows",)
        cache = () if self.cfg.gradient_checkpointing else ("prompt_cache",)  # the recompute keeps no KV cache
        return ("rows", *cache, *(("packed",) if self.sdpa else ()))

    def _chunks(self, batch: RolloutBatch, rows) -> list[slice]:
        """``rows`` (in their order) split into forward/backward passes: ``train_microbatch_size`` rows each, or as
        many whole groups as fit in ``train_microbatch_tokens``."""
        size = self.cfg.train_microbatch_size
        if size:
            return [slice(lo, lo + size) for lo in range(0, len(rows), size)]
        unit = self.n if self.share_prompts else 1
        return token_budget_chunks(
            batch.prompt_mask[rows].sum(-1),
            batch.response_lengths[rows],
            unit,
            self.cfg.train_microbatch_tokens,
            self.share_prompts,
        )

    def _by_length(self, batch: RolloutBatch, shard_rows, local) -> np.ndarray:
        """``local`` (indices into the shard) ordered by token count, so each micro-batch holds rows of similar
        length and pads little; whole groups move together when prompts are shared. The loss is normalised over
        the whole minibatch, so the grouping changes no value."""
        rows = shard_rows[local]
        tokens = batch.prompt_mask[rows].sum(-1) + batch.response_lengths[rows]
        if not self.share_prompts:
            return local[np.argsort(tokens, kind="stable")]
        groups = local.reshape(-1, self.n)
        return groups[np.argsort(tokens.reshape(-1, self.n).max(-1), kind="stable")].reshape(-1)

    def _layout(self, t: dict) -> str:
        return choose_layout(
            t["prompt_mask"].sum(-1).numpy(force=True),
            t["response_mask"].sum(-1).numpy(force=True),
            self.n,
            self.pair_flops,
            self.layouts,
        )

    def _logprobs(self, model, t: dict, with_entropy: bool = False, layout: str | None = None):
        """Per-token log-probs (and entropy) of a micro-batch's inputs, under the configured precision, in ``layout``
        (None: the one ``_layout`` picks)."""
        layout = layout or self._layout(t)
        group = {} if layout == "rows" else {"group_size": self.n}
        with self._compute():
            return LAYOUTS[layout](
                model,
                **t,
                **group,
                temperature=self.generation.temperature,
                with_entropy=with_entropy,
                vocab_size=self.vocab_size,
            )

    def set_threads(self, n: int, call: int) -> None:
        """Train call ``call`` uses ``n`` threads from its next decoder layer (forward or backward) or pass on
        (called on a second thread: the driver lends the cores of producers that have stopped; ``ThreadLease``)."""
        self.threads.lend(n, call)

    def train_step(
        self, batch: RolloutBatch, threads: int | None = None, call: int | None = None, total_steps: int | None = None
    ) -> dict:
        """One training step on the global batch of the step, with ``threads`` CPU threads (None: this actor's own;
        a ``set_threads`` for the same ``call`` may raise it while the step runs), of a run of ``total_steps`` (the
        learning-rate schedule's horizon); returns its metrics reduced over every DP rank."""
        assert total_steps is not None or self.cfg.lr_schedule == "constant", "a decaying schedule needs its horizon"
        self.total_steps = total_steps or self.step_count + 1
        with self.threads.running(call, threads):  # cores go back to the producers with the step's end
            return self._train_step(batch)

    def _train_step(self, batch: RolloutBatch) -> dict:
        start = time.perf_counter()
        metrics = StepMetrics()
        n_rows = len(batch)
        assert n_rows % (self.dp_size * self.n) == 0, (n_rows, self.dp_size, self.n)
        # Arrays from the object store are read-only: copy the small ones into tensors.
        loss_mask = torch.tensor(batch.trained_mask(), dtype=torch.float32)  # sampled tokens only
        if self.algo.mask_truncated:
            loss_mask = mask_truncated(loss_mask, torch.tensor(batch.truncated))
        adv = batch_advantages(batch, loss_mask, self.algo)
        # DP shard: contiguous whole groups (rows are prompt-major).
        shard = n_rows // self.dp_size
        num_minibatches = self.cfg.train_batch_size // self.cfg.train_minibatch_size
        per_step = num_minibatches * self.cfg.num_iterations  # optimizer steps this training step makes
        shard_rows = np.arange(self.dp_rank * shard, (self.dp_rank + 1) * shard)
        old_lp, t_old = None, time.perf_counter()
        if per_step > 1:  # the policy before this step's first update, over the whole shard
            mb_rows = shard // num_minibatches
            old_lp = (
                self._pipeline_logprobs(batch, shard_rows, mb_rows)
                if self.cfg.plugin.pp_size > 1
                else self._old_logprobs(batch, shard_rows, mb_rows)
            )
        t_old = time.perf_counter() - t_old
        ref_lp = self._logprobs_no_grad(self.ref_model, batch, shard_rows) if self.ref_model is not None else None
        step_loss = torch.zeros(1, dtype=torch.float64)
        self.steps.begin()
        for k in range(per_step):  # pass k // num_minibatches over the batch, its minibatch k % num_minibatches
            losses = self._minibatch(
                batch,
                k % num_minibatches,
                num_minibatches,
                shard_rows,
                loss_mask,
                adv,
                old_lp,
                ref_lp,
                metrics,
                first=k == 0,
            )
            step_loss += sum(losses) / self.dp_size / per_step
            self.steps.step(losses, self.step_count * per_step + k, self.total_steps * per_step, per_step)
        self.step_count += 1
        out = metrics.reduce(self._dp_all_reduce if self.dp_size > 1 else None)
        if self.dp_size > 1:
            torch.distributed.all_reduce(step_loss, group=self.plugin.dp_group)
        out["loss/policy"] = float(step_loss)
        out["time/train_step"] = time.perf_counter() - start
        out["time/old_logprobs"] = t_old
        out["actor/threads"] = self.threads.used
        out.update(self.steps.report())
        return out

    def _minibatch(
        self, batch, m, num_minibatches, shard_rows, loss_mask, adv, old_lp, ref_lp, metrics, first: bool
    ) -> list[float]:
        """Forward and backward of minibatch ``m`` of this rank's shard, in passes; returns each pass's loss. The
        step's ``first`` minibatch runs before any update: its forward writes its rows' old log-probs."""
        shard = len(shard_rows)
        mb_rows = shard // num_minibatches
        # The loss is normalised over the global minibatch m: rows of minibatch m on every DP rank.
        global_rows = np.concatenate(
            [np.arange(r * shard + m * mb_rows, r * shard + (m + 1) * mb_rows) for r in range(self.dp_size)]
        )
        norm = LossNorm.from_mask(loss_mask[global_rows], self.generation.max_new_tokens, self.dp_size)
        local = np.arange(m * mb_rows, (m + 1) * mb_rows)
        if self.cfg.plugin.pp_size > 1:
            return [
                self._pipeline_minibatch(
                    batch,
                    shard_rows[local],
                    loss_mask,
                    adv,
                    norm,
                    metrics,
                    old_lp[local] if old_lp is not None else None,
                    ref_lp[local] if ref_lp is not None else None,
                )
            ]
        order = self._by_length(batch, shard_rows, local)
        losses = []
        chunks = self._chunks(batch, shard_rows[order])
        for i, chunk in enumerate(chunks):
            idx = order[chunk]
            self.threads.apply()
            with self._grad_sync(last=i == len(chunks) - 1):
                losses.append(
                    self._microbatch(batch, shard_rows[idx], idx, loss_mask, adv, old_lp, ref_lp, norm, metrics, first)
                )
        return losses

    def _grad_sync(self, last: bool):
        """Whether torch DDP (which ColossalAI wraps the model in without PP, and with several DP ranks only without
        ZeRO) all-reduces this pass's gradients: only in the minibatch's last pass (the passes before accumulate
        theirs, which that all-reduce then sums), and never with one DP rank, where the all-reduce changes nothing
        yet copies every gradient into DDP's buckets."""
        ddp = self.model.module
        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel) or (last and self.dp_size > 1):
            return contextlib.nullcontext()
        return ddp.no_sync()

    def _microbatch(
        self, batch, rows, idx, loss_mask, adv, old_lp, ref_lp, norm, metrics: StepMetrics, first: bool
    ) -> float:
        """Forward and backward of one micro-batch (``rows`` of the batch, ``idx`` of the shard), trimmed to its
        own longest prompt and response; returns its loss. ``first``: no update yet this step, so its log-probs are
        the old ones (kept in ``old_lp`` for the later passes)."""
        t = self._tensors(batch, rows)
        r = t["response_ids"].shape[1]
        layout = self._layout(t)
        logprobs, entropy = self._logprobs(self.model, t, with_entropy=True, layout=layout)
        metrics.add("actor/packed_rows_frac", float(layout == "packed"), len(rows))
        if first and old_lp is not None:
            old_lp[idx, :r] = logprobs.detach()
        loss = self._loss(
            batch,
            rows,
            logprobs,
            entropy,
            loss_mask[rows, :r].to(self.device),
            adv[rows, :r].to(self.device),
            old_lp[idx, :r] if old_lp is not None else None,
            ref_lp[idx, :r] if ref_lp is not None else None,
            self._rollout_logprobs(batch, rows, r),
            norm,
            metrics,
        )
        self.booster.backward(loss, self.optimizer)
        return loss.item()

    def _loss(self, batch, rows, logprobs, entropy, mask, adv, old, ref, rollout, norm, metrics: StepMetrics):
        """The policy loss of a micro-batch's log-probs (``old`` None: they are their own old policy, detached),
        recording its metrics weighted by its loss tokens, the entropy and the engine-trainer gap; both the plain and
        the pipelined step call it."""
        inp = LossInput(
            logprobs=logprobs,
            old_logprobs=old if old is not None else logprobs.detach(),
            advantages=adv,
            mask=mask,
            ref_logprobs=ref,
            rollout_logprobs=rollout,
        )
        loss, m_metrics = compute_policy_loss(inp, self.algo, norm)
        self._behaviour_metrics(metrics, batch, rows, inp.old_logprobs, rollout, mask)
        weight = float(mask.sum())
        for k, v in m_metrics.items():
            if k != "loss/policy":
                metrics.add(k, v, weight)
        metrics.add("actor/entropy", (entropy * mask).sum() / mask.sum().clamp(min=1), weight)
        return loss

    def _dp_all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        ops = {
            "sum": torch.distributed.ReduceOp.SUM,
            "max": torch.distributed.ReduceOp.MAX,
            "min": torch.distributed.ReduceOp.MIN,
        }
        on_device = tensor.to(self.device)
        torch.distributed.all_reduce(on_device, op=ops[op], group=self.plugin.dp_group)
        tensor.copy_(on_device.cpu())

    def _behaviour_metrics(self, metrics: StepMetrics, batch, rows, old, rollout, mask) -> None:
        """The engine-trainer log-prob gap over the fresh rows, those whose every token was sampled by the very
        weights this step starts from (so any gap is the engines' and precisions' difference, not staleness; a row
        that spans a push is left out whole, its later tokens attending to keys the earlier weights computed), and the
        share of tokens whose engine log-probs are not valid for the sampling settings (no off-policy correction
        possible for them)."""
        tokens = float(mask.sum())
        metrics.add("loss/is_unavailable_frac", float(rollout is None), tokens)
        if rollout is None:
            if self.algo.off_policy_correction != "none" and not self._warned_unavailable:
                self._warned_unavailable = True
                log.warning(
                    "consumer %d: the engine's log-probs are not valid for these sampling settings; %s is not "
                    "applied to such rows (loss/is_unavailable_frac)",
                    self.rank,
                    self.algo.off_policy_correction,
                )
            return
        fresh = fresh_rows(batch.token_versions[rows][:, : mask.shape[1]], mask.cpu().numpy() > 0, self.step_count)
        same = torch.from_numpy(fresh[:, None]).to(mask) * mask
        n = float(same.sum())
        if n:
            metrics.add("rollout/engine_trainer_gap_abs", ((old.detach() - rollout).abs() * same).sum() / n, n)

    def _rollout_logprobs(self, batch: RolloutBatch, rows, width: int | None = None):
        valid = batch.extras.get("logprobs_valid")
        if valid is not None and not np.all(valid[rows]):
            return None
        return torch.from_numpy(batch.rollout_logprobs[rows][:, :width]).to(self.device)

    def _old_logprobs(self, batch: RolloutBatch, shard_rows, mb_rows: int) -> torch.Tensor:
        """The shard's log-probs before this step's first update, as the first pass's ratios need them. Only the rows
        after the first minibatch take a forward of their own here: the first minibatch's forward with gradients
        runs before any update and writes its rows (``_microbatch`` with ``first``)."""
        old = torch.zeros(len(shard_rows), batch.response_ids.shape[1], device=self.device)
        if len(shard_rows) > mb_rows:
            old[mb_rows:] = self._logprobs_no_grad(self.model, batch, shard_rows[mb_rows:])
        return old

    @torch.no_grad()
    def _logprobs_no_grad(self, model, batch: RolloutBatch, rows) -> torch.Tensor:
        out = []
        for chunk in self._chunks(batch, rows):
            t = self._tensors(batch, rows[chunk])
            lp, _ = self._logprobs(model, t)
            out.append(torch.nn.functional.pad(lp, (0, batch.response_ids.shape[1] - lp.shape[1])))
        return torch.cat(out)

    # ---- weights ---------------------------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (TP-gathered) weights under the Hugging Face names; collective over the TP group."""
        from coati.distributed.trainer.colossal_policy import gathered_weights  # deferred: imports ColossalAI

        return gathered_weights(self.model.unwrap())

    def join_weight_group(
        self, world_size: int, group_name: str, backend: str, timeout_s: float, wire_dtype: str | None = None
    ) -> bool:
        """Join ``group_name`` as its sender; full pushes then travel in ``wire_dtype`` (the engines' weight dtype,
        e.g. "bfloat16"; None: the trainer's own dtypes)."""

        init_group(world_size, 0, group_name, backend=backend, timeout_s=timeout_s)
        self.weight_group = group_name
        self.wire_dtype = getattr(torch, wire_dtype) if wire_dtype else None
        return True

    def push_weights(self, version: int) -> dict:
        """Senders broadcast their stage's weights to the producers; every rank takes part in the TP gather. Returns
        the push's seconds and, from a sender of full weights, the fingerprints of what it sent (``attest``: each
        tensor as it travelled, and the weights tied to them) for the driver to compare with what engines hold."""

        start = time.perf_counter()
        if self.cfg.lora_rank:
            state = adapter_tensors(self._named())
        else:
            state = cast_for_wire(self.full_state_dict(), self.wire_dtype)  # a non-sender's is None
        if self.weight_group is not None:
            ray_broadcast_tensor_dict(state, 0, self.device, self.weight_group, version=version)
        sent = None
        if self.weight_group is not None and state is not None:
            sent = fingerprints(state, version, *self._push_layout())
        return {"seconds": time.perf_counter() - start, "fingerprints": sent}

    def _push_layout(self) -> tuple[dict[str, str], frozenset[str]]:
        """(the weights tied to others, those stored transposed) that full pushes' fingerprints follow (``attest``);
        none for an adapter's."""

        if self.cfg.lora_rank:
            return {}, frozenset()
        if not hasattr(self, "_layout_for_attest"):
            config = causal_lm(self.model).config
            self._layout_for_attest = tied_weights(config), transposed_weights(config)
        return self._layout_for_attest

    def adapter(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter's tensors on CPU, under the names a push carries."""
        return {k: v.cpu().clone() for k, v in adapter_tensors(self._named()).items()}

    def _named(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.unwrap(unwrap_peft=False).named_parameters()}  # peft's names

    def weights(self) -> dict[str, torch.Tensor]:
        """This stage's full weights on CPU (all stages' when pp_size == 1), with a LoRA adapter merged in;
        collective over TP."""
        if self.cfg.lora_rank:
            return {k: v.cpu().clone() for k, v in merged_state(self._named(), self.cfg.lora_scale).items()}
        return {k: v.cpu().clone() for k, v in self.full_state_dict().items()}

    def save_checkpoint(self, folder: str) -> bool:
        """Model and optimizer through the booster (sharded as the plugin holds them), plus this rank's RNG. Refused
        when any weight is not finite: a checkpoint must be something worth resuming from."""

        bad = [n for n, p in self.model.unwrap().named_parameters() if not all_finite([p.detach()])]
        if bad:
            raise RuntimeError(
                f"refusing to checkpoint into {folder}: non-finite weights in {bad[:5]} ({len(bad)} tensors)"
            )
        # On CPU, ColossalAI's saver writes parameters as they are, and torch.save writes a view's whole storage.
        with separate_storages(self.model.unwrap()) if self.device.type == "cpu" else contextlib.nullcontext():
            self.booster.save_model(self.model, os.path.join(folder, "model"), shard=True)
        self.booster.save_optimizer(self.optimizer, os.path.join(folder, "optimizer"), shard=True)
        torch.save(
            {"torch": torch.get_rng_state(), "step": self.step_count},
            os.path.join(folder, f"rng-consumer-{self.rank}.pt"),
        )
        return True

    def load_checkpoint(self, folder: str) -> int:
        self.booster.load_model(self.model, os.path.join(folder, "model"))
        self.booster.load_optimizer(self.optimizer, os.path.join(folder, "optimizer"))
        state = torch.load(os.path.join(folder, f"rng-consumer-{self.rank}.pt"), weights_only=True)
        torch.set_rng_state(state["torch"])
        self.step_count = state["step"]
        return self.step_count
