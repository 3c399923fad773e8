"""Producer actor: owns a dataset shard, an inference backend and a reward pool; turns prompts into scored
RolloutBatches for the consumers, and loads the weights the consumers push.

Generation runs micro-batch by micro-batch; each finished micro-batch's completions go to the reward pool at once, so
scoring overlaps the next micro-batch's generation.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from coati.distributed.envs import resolve_environment
from coati.distributed.envs.episodes import EpisodeRunner, TurnTemplate
from coati.distributed.inference import backend_class
from coati.distributed.model.precision import generation_dtype
from coati.distributed.record import RolloutBatch, run_group_ids
from coati.distributed.rollout.data import DataCursor
from coati.distributed.rollout.draw import Rounds, Stream, label_versions
from coati.distributed.rollout.evaluation import EvalShare, evaluate_share
from coati.distributed.rollout.images import ImagePrompts
from coati.distributed.rollout.plan import RolloutPlan
from coati.distributed.rollout.receipt import PushReceipt
from coati.distributed.rollout.scoring import Scorer, episode_results, shaped_rewards
from coati.distributed.rollout.teaching import Teaching
from coati.distributed.runtime.liveness import note_progress, start_heartbeat
from coati.distributed.runtime.placement import whereabouts
from coati.distributed.runtime.startup import mark, marks
from coati.distributed.runtime.threads import ThreadLease


class Producer:
    """One producer: ``plan`` its role's inputs, resolved once by preflight (``RolloutPlan``: its sections of the
    config, the resolved model, datasets, prompt format and engine options, and what it needs of the trainer);
    ``producer_idx`` its identity; ``reward_servers`` the reward's model components ({component: [(name, actor)]}),
    shared by all producers; ``teacher_servers`` [(name, actor)] the teacher's, when the run distils."""

    def __init__(
        self,
        producer_idx: int,
        plan: RolloutPlan,
        reward_servers: dict[str, list] | None = None,
        teacher_servers: list | None = None,
    ):
        mark("imported")  # the worker is up and this module's imports are done
        start_heartbeat()
        self.idx, self.num_producers = producer_idx, plan.num_producers
        self.model_path, self.backend_name = plan.model_path, plan.backend
        self.generation, self.algorithm, self.reward = plan.generation, plan.algorithm, plan.reward
        self.dataset_spec, self.eval_spec = plan.train_dataset, plan.eval_dataset
        self.n, self.microbatch_size = plan.num_generations, plan.microbatch_size
        self.prompt_format, self.seed = plan.prompt_format, plan.seed
        self.processor_path = plan.processor_path
        self.backend_options = dict(plan.engine_options or {})
        self.stream_prompts = plan.stream_prompts
        """groups the engine is kept generating across calls (0: rounds, each call generating its prompts to the
        end)"""
        p = plan.trainer_precision
        self.trainer_precision = (p.compute_dtype, p.precision, p.tp_size)
        """(consumer.compute_dtype, plugin precision, tp_size): the engine's weights default to the trainer's compute
        dtype"""
        self.lora = plan.lora.as_dict() if plan.lora else None
        """{rank, alpha, target_modules} when consumers push LoRA adapters, else None"""
        self.reward_servers = dict(reward_servers or {})
        self.teacher_link, self.teacher_servers = plan.teacher, list(teacher_servers or [])
        self.calls = 0
        """rollout calls made (a group's id carries its call's number)"""
        self.threads = ThreadLease()
        """the cores of the rollout call in progress, raised by ``set_threads``"""
        self.version = 0
        self.weight_groups: list[str] = []

    def setup(self) -> dict:
        """Start the engine, read the data, start the scorer (and the environment's runner); returns where the
        producer runs, what its engine computes with and its start-up marks (``startup``)."""
        mark("setup")
        seed = self.seed * 1000 + self.idx
        torch.manual_seed(seed)
        options = self._engine_options(seed)
        self.backend = backend_class(self.backend_name)(self.model_path, self.generation, **options)
        mark("engine")
        self.backend.between_steps = self.threads.apply  # in the generating thread, whose OpenMP setting it uses
        self.tokenizer = self.backend.tokenizer
        self.image_prompts = (
            ImagePrompts(self.processor_path, self.prompt_format.system_prompt) if self.processor_path else None
        )
        """a vision-language model's prompts, rendered with their images by its processor (None: text prompts)"""
        self.rows = self.dataset_spec.load()
        a = self.algorithm
        self.cursor = DataCursor(
            len(self.rows),
            self.idx,
            self.num_producers,
            seed=self.seed,
            skip_after=a.skip_no_signal_after,
            recheck=a.skip_recheck,
        )
        self.eval_rows = self.eval_spec.load() if self.eval_spec else []
        r = self.reward
        self.scorer = Scorer(r, self.n, self.tokenizer, self.reward_servers)
        self.teaching = (
            Teaching(self.teacher_link, self.teacher_servers, self.prompt_format) if self.teacher_link else None
        )
        self.episodes = None  # multi-turn: episodes scored by their environment instead of completions by the pool
        if r.episodes:
            env = r.env
            self.episodes = EpisodeRunner(
                resolve_environment(env.name),
                env.kwargs,
                TurnTemplate(self.tokenizer),
                env.max_turns,
                env.max_tokens,
                env.step_timeout_s,
            )
        self.draws = self._draws()
        wire = self.backend.weight_dtype()
        mark("ready")
        return {
            **whereabouts(),
            "startup": marks(),
            "rows": len(self.cursor.indices),
            "device": str(getattr(self.backend, "device", "")),
            "dtype": options.get("dtype", "the backend's default"),
            "weight_dtype": str(wire).removeprefix("torch.") if wire is not None else None,
            "malloc": os.environ.get("GLIBC_TUNABLES", ""),
        }

    def _engine_options(self, seed: int) -> dict:
        """The engine's options: the plan's, its seed, and weights in the trainer's compute dtype unless given."""
        options = {"seed": seed, **self.backend_options}
        if "dtype" not in options:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            dtype = generation_dtype(*self.trainer_precision, device)
            if dtype is not None:
                options["dtype"] = dtype
        return options

    def _draws(self) -> Stream | Rounds:
        """How calls draw their groups: streamed through the engine (``stream_prompts``) or in rounds."""
        if not self.stream_prompts:
            return Rounds(
                self.cursor, self.rows, self.microbatch_size, lambda rows: self._rollouts(rows, self.n, greedy=False)
            )
        return Stream(
            self.cursor,
            self.rows,
            self.stream_prompts,
            self.backend,
            lambda row: self.prompt_format.encode(self.tokenizer, row),
            self.n,
            lambda batch, rows: self.scorer.submit(batch, rows, self.version),
        )

    # ---- rollouts ------------------------------------------------------------------------------------------------

    def generate(self, num_prompts: int, threads: int | None = None, call: int | None = None) -> RolloutBatch:
        """Roll out the next ``num_prompts`` prompts of this shard, n completions each, scored and shaped, with
        ``threads`` CPU threads (None: this actor's own); a ``set_threads`` for the same ``call`` may raise them
        between two decode steps."""
        with self.threads.running(call, threads):
            return self._generate(num_prompts)

    def set_threads(self, n: int, call: int) -> None:
        """Rollout call ``call`` uses ``n`` threads from its next decode step on (called on a second thread: the
        driver lends the consumers' cores once their training step has ended)."""
        self.threads.lend(n, call)

    def _generate(self, num_prompts: int) -> RolloutBatch:
        t_start, start_version = time.perf_counter(), self.version
        skipped_before = self.cursor.skipped
        drawn = self.draws.draw(num_prompts)
        drawn.label(self.n)
        picks = drawn.picks
        out = RolloutBatch.concat(drawn.batches, pad_id=self.backend.pad_id)
        # The teacher scores while the reward workers do (their own processes).
        teacher_s = self.teaching.annotate(out, [self.rows[i] for _, i in picks], self.n) if self.teaching else None
        t0 = time.perf_counter()
        results = self.scorer.gather(drawn.futures)
        wait_s = time.perf_counter() - t0
        texts = [getattr(f, "completion_text", None) for f in drawn.futures]
        self.scorer.apply(out, results, [self.rows[i] for _, i in picks], texts)
        for g, (_, row) in enumerate(picks):
            self.cursor.record(row, bool(out.no_signal[g * self.n]))
        if self.episodes is None:  # an episode's length is bounded by env_max_tokens instead
            out.rewards = shaped_rewards(out, self.algorithm, self.generation.max_new_tokens)
        self.calls += 1
        out.group_ids = run_group_ids(out.group_ids, self.idx, self.calls)
        label_versions(out, start_version)
        call = {
            "producer": int(self.idx),
            "skipped_prompts": int(self.cursor.skipped - skipped_before),
            "time/generate": float(drawn.generate_s),
            **{k: int(n) for k, n in self.threads.counts().items()},
            "time/reward_wait": float(wait_s),
        }
        if teacher_s is not None:
            call["time/teacher"] = float(teacher_s)
        call["time/producer_total"] = time.perf_counter() - t_start
        out.calls, out.call_index = [call], np.zeros(len(out), dtype=np.int64)
        return out.validate()

    def _rollouts(self, rows: list[dict], n: int, greedy: bool) -> tuple[RolloutBatch, list]:
        """``n`` rollouts of each row and their scores (futures of RewardResults): completions scored by the reward
        pool, or episodes scored by their environment."""
        if self.episodes is None:
            if self.image_prompts is not None:
                images = self.image_prompts.encode(rows)
                batch = self.backend.generate([p.ids for p in images], n, greedy=greedy, images=images)
            else:
                prompts = [self.prompt_format.encode(self.tokenizer, r) for r in rows]
                batch = self.backend.generate(prompts, n, greedy=greedy)
            return batch, self.scorer.submit(batch, rows, self.version)
        batch = self.episodes.rollouts(
            lambda contexts: self.backend.generate(contexts, 1, greedy=greedy),
            rows,
            n,
            self.backend.pad_id,
            self.version,
        )
        return batch, Scorer.done(episode_results(batch))

    def evaluate(self, max_items: int | None = None, threads: int | None = None) -> EvalShare:
        """Greedy accuracy on this producer's share of the held-out rows (strict and lenient), with ``threads`` CPU
        threads (None: this actor's own)."""
        with self.threads.running(None, threads):
            self.draws.withdraw()  # greedy rows of the held-out set, alone in the engine
            indices = list(range(len(self.eval_rows)))[self.idx :: self.num_producers][:max_items]
            return evaluate_share(
                self.eval_rows,
                indices,
                self.microbatch_size,
                lambda rows: self._rollouts(rows, 1, greedy=True),
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            )

    # ---- weights and state ---------------------------------------------------------------------------------------

    def join_weight_groups(
        self, world_size: int, rank: int, group_names: list[str], backend: str, timeout_s: float
    ) -> bool:
        """Join one weight group per consumer pipeline stage (one group when pp_size == 1) on ``backend`` (nccl or
        gloo), at ranks ``rank ..`` (one per engine process holding weights)."""
        for name in group_names:
            self.backend.join_weight_group(world_size, rank, name, backend, timeout_s)
        self.weight_groups = list(group_names)
        return True

    def receive_weights(self, threads: int | None = None) -> dict:
        """Receive one push per stage, each loaded as its buckets land (one stage at a time); an engine that loads a
        push once it is in loads it with ``threads`` (None: the receiving thread's own). Returns the version and
        how the push travelled: collective calls, the share of bytes sent straight from the consumer's weights (not
        packed), and the share that went straight into the engine's weights (no staging copy); for an engine that
        times them, the push's seconds, the seconds generation stood still for it and the threads it loaded with."""
        receipt = PushReceipt(self.version, fingerprints={})
        for i, name in enumerate(self.weight_groups):
            if self.lora is None:
                receipt.add(self.backend.receive_weights(name, threads), first=i == 0)
            else:
                receipt.add(self.backend.receive_adapter(name, self.lora), first=i == 0)
            note_progress()  # a stage loaded (an engine whose workers receive reports no collective here)
        self.version = receipt.version
        return receipt.report()

    def sleep(self) -> tuple[int, int]:
        """Free the engine's accelerator memory; returns this process's CUDA bytes allocated (before, after)."""
        before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
        self.backend.sleep()
        return before, torch.cuda.memory_allocated() if torch.cuda.is_available() else 0

    def wake(self) -> bool:
        self.backend.wake()
        return True

    def weights(self) -> dict[str, torch.Tensor]:
        """The backend's current weights (tests compare them with the consumer's)."""
        return self.backend.state_dict()

    def state(self) -> dict:
        """Dataset position, call counter and RNG: what a checkpoint needs to continue with the same data order and
        the same samples. A streaming engine is emptied first: its prompts are drawn again after a resume, as
        they are by the run that goes on."""
        self.draws.withdraw()
        state = {
            "cursor": self.cursor.state(),
            "calls": self.calls,
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }
        state.update(self.scorer.state())
        return state

    def handed_out(self) -> dict:
        """The (episode, row) pairs this producer's cursor handed out and passed over (``DataCursor.handed_out``),
        once a streaming engine's unfinished groups are handed back."""
        self.draws.withdraw()
        return self.cursor.handed_out()

    def restore(self, state: dict) -> None:
        self.cursor.restore(state["cursor"])
        self.calls = state["calls"]
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])
        self.scorer.restore(state)

    def close(self) -> None:
        self.scorer.close()
        if self.episodes is not None:
            self.episodes.close()
