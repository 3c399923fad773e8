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

from coati.distributed.algo.shaping import overlong_penalty
from coati.distributed.envs import resolve_environment
from coati.distributed.envs.episodes import EpisodeRunner, TurnTemplate
from coati.distributed.inference import backend_class
from coati.distributed.placement import whereabouts
from coati.distributed.precision import generation_dtype
from coati.distributed.record import RolloutBatch, oldest_versions
from coati.distributed.reward import RewardResult
from coati.distributed.rollout.data import DataCursor, load_rows
from coati.distributed.rollout.scoring import Scorer
from coati.distributed.threads import ThreadLease


class Producer:
    """One producer: ``config`` is the run's config tree (its producer, generation, reward and algorithm sections
    are read here, with the trainer's precision and LoRA settings from its consumer section); ``plan`` the driver's
    plan of values derived once (the resolved model paths, datasets, prompt format, engine options, streaming);
    ``reward_servers`` the reward's model components ({component: [(name, actor)]}), shared by all producers."""

    def __init__(self, producer_idx: int, config, plan, reward_servers: dict[str, list] | None = None):
        c = config.consumer
        self.idx, self.num_producers = producer_idx, config.producer.num_producers
        self.model_path, self.backend_name = plan.inference_model_path, config.producer.backend
        self.generation, self.algorithm, self.reward = config.generation, config.algo_config, config.reward
        self.dataset_spec, self.eval_spec = plan.train_dataset, plan.eval_dataset
        self.n, self.microbatch_size = config.producer.num_generations, config.producer.inference_microbatch_size
        self.prompt_format, self.seed = plan.prompt_format, config.run.seed
        self.backend_options = dict(plan.inference_options or {})
        self.stream_prompts = plan.stream_prompts
        """groups the engine is kept generating across calls (0: rounds, each call generating its prompts to the
        end)"""
        self.trainer_precision = (c.compute_dtype, c.plugin.precision, c.plugin.tp_size)
        """(consumer.compute_dtype, plugin precision, tp_size): the engine's weights default to the trainer's compute
        dtype"""
        self.lora = (
            {"rank": c.lora_rank, "alpha": c.lora_alpha, "target_modules": c.lora_target_modules}
            if c.lora_rank
            else None
        )
        """{rank, alpha, target_modules} when consumers push LoRA adapters, else None"""
        self.reward_servers = dict(reward_servers or {})
        self.in_engine: dict[int, tuple[int, int]] = {}
        """streaming: submitted key -> (episode, row) of each group the engine holds"""
        self.submitted = 0
        """streaming: groups submitted so far (each one's key)"""
        self.threads = ThreadLease()
        """the cores of the rollout call in progress, raised by ``set_threads``"""
        self.version = 0
        self.weight_groups: list[str] = []

    def setup(self) -> dict:

        seed = self.seed * 1000 + self.idx
        torch.manual_seed(seed)
        options = {"seed": seed, **self.backend_options}
        if "dtype" not in options:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            dtype = generation_dtype(*self.trainer_precision, device)
            if dtype is not None:
                options["dtype"] = dtype
        self.backend = backend_class(self.backend_name)(self.model_path, self.generation, **options)
        self.backend.between_steps = self.threads.apply  # in the generating thread, whose OpenMP setting it uses
        self.tokenizer = self.backend.tokenizer
        self.rows = load_rows(**self.dataset_spec)
        a = self.algorithm
        self.cursor = DataCursor(
            len(self.rows),
            self.idx,
            self.num_producers,
            seed=self.seed,
            skip_after=a.skip_no_signal_after,
            recheck=a.skip_recheck,
        )
        self.eval_rows = load_rows(**self.eval_spec) if self.eval_spec else []
        r = self.reward
        self.scorer = Scorer(r, self.n, self.tokenizer, self.reward_servers)
        self.episodes = None  # multi-turn: episodes scored by their environment instead of completions by the pool
        if r.env is not None:
            self.episodes = EpisodeRunner(
                resolve_environment(r.env),
                r.env_kwargs,
                TurnTemplate(self.tokenizer),
                r.env_max_turns,
                r.env_max_tokens,
                r.env_step_timeout_s,
            )

        wire = self.backend.weight_dtype()
        return {
            **whereabouts(),
            "rows": len(self.cursor.indices),
            "device": str(getattr(self.backend, "device", "")),
            "dtype": options.get("dtype", "the backend's default"),
            "weight_dtype": str(wire).removeprefix("torch.") if wire is not None else None,
            "malloc": os.environ.get("GLIBC_TUNABLES", ""),
        }

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
        draw = self._stream if self.stream_prompts else self._round
        picks, batches, futures, gen_s = draw(num_prompts)
        lo = 0
        for batch in batches:  # picks in the order of the batches' groups
            chunk = picks[lo : lo + len(batch) // self.n]
            batch.extras["prompt_index"] = np.repeat(np.array([i for _, i in chunk], dtype=np.int64), self.n)
            batch.extras["episode"] = np.repeat(np.array([e for e, _ in chunk], dtype=np.int64), self.n)
            batch.group_ids = batch.group_ids + lo  # unique within this call
            lo += len(chunk)
        assert lo == len(picks), (lo, len(picks))
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
        wait_s = time.perf_counter() - t0
        out = RolloutBatch.concat(batches, pad_id=self.backend.pad_id)
        self.scorer.apply(out, results, [self.rows[i] for _, i in picks])
        for g, (_, row) in enumerate(picks):
            self.cursor.record(row, bool(out.no_signal[g * self.n]))
        skipped = np.zeros(len(out), dtype=np.int64)  # prompts passed over by this call, counted on its first row
        skipped[:1] = self.cursor.skipped - skipped_before
        out.extras["skipped_prompts"] = skipped
        buffer = self.algorithm.overlong_buffer_len(self.generation.max_new_tokens)
        if buffer and self.episodes is None:  # an episode's length is bounded by env_max_tokens instead
            penalty = overlong_penalty(
                torch.from_numpy(out.response_lengths),
                self.generation.max_new_tokens,
                buffer,
                self.algorithm.overlong_penalty_factor,
            )
            out.rewards = (out.task_rewards + penalty.numpy()).astype(np.float32)
        out.extras["producer"] = np.full(len(out), self.idx, dtype=np.int64)
        out.group_ids = out.group_ids + (self.idx << 40) + (self._calls() << 20)
        # A backend that loads pushes mid-batch labels each token; otherwise the whole batch is the start version.
        start = np.full(len(out), start_version, dtype=np.int64)
        if out.token_versions is None:
            out.token_versions = np.where(out.response_mask, start[:, None], 0)
        out.policy_version = oldest_versions(out.token_versions, out.trained_mask(), start)
        out.extras["time/generate"] = np.full(len(out), gen_s)
        # The threads this call started with, the most it ran with, and those it ended with (cores lent, taken back).
        threads = {
            "threads_start": self.threads.started,
            "threads": self.threads.used,
            "threads_end": torch.get_num_threads(),
        }
        out.extras.update({k: np.full(len(out), n, dtype=np.int64) for k, n in threads.items()})
        out.extras["time/reward_wait"] = np.full(len(out), wait_s)
        out.extras["time/producer_total"] = np.full(len(out), time.perf_counter() - t_start)
        return out.validate()

    def _round(self, num_prompts: int) -> tuple[list, list[RolloutBatch], list, float]:
        """The next ``num_prompts`` prompts, generated to the end micro-batch by micro-batch, each micro-batch's
        completions sent to the reward pool as it ends: (picks, batches, reward futures, generation seconds)."""
        picks = self.cursor.take(num_prompts)
        batches, futures, gen_s = [], [], 0.0
        for lo in range(0, len(picks), self.microbatch_size):
            t0 = time.perf_counter()
            batch, scored = self._rollouts(
                [self.rows[i] for _, i in picks[lo : lo + self.microbatch_size]], self.n, greedy=False
            )
            gen_s += time.perf_counter() - t0
            futures.extend(scored)
            batches.append(batch)
        return picks, batches, futures, gen_s

    def _stream(self, num_prompts: int) -> tuple[list, list[RolloutBatch], list, float]:
        """At least ``num_prompts`` groups, in the order they finish, from an engine kept at ``stream_prompts``
        groups: a prompt is added as each group finishes, and those unfinished when enough have finished stay in
        the engine for the next call (their tokens record the versions that sampled them)."""
        picks, batches, futures, gen_s = [], [], [], 0.0
        while len(picks) < num_prompts:
            t0 = time.perf_counter()
            for pick in self.cursor.take(self.stream_prompts - len(self.in_engine)):
                self.submitted += 1
                key = self.submitted
                self.in_engine[key] = pick
                self.backend.submit(key, self.prompt_format.encode(self.tokenizer, self.rows[pick[1]]), self.n)
            finished = self.backend.collect()
            gen_s += time.perf_counter() - t0
            for key, batch in finished:
                pick = self.in_engine.pop(key)
                picks.append(pick)
                batches.append(batch)
                futures.extend(self.scorer.submit(batch, [self.rows[pick[1]]], self.version))
        return picks, batches, futures, gen_s

    def _withdraw(self) -> None:
        """Empty a streaming engine: its unfinished groups' prompts go back to the cursor, to be drawn first."""
        if self.in_engine:
            self.cursor.give_back([self.in_engine.pop(key) for key in self.backend.withdraw()])
        assert not self.in_engine, "every group in the engine was withdrawn"

    def _calls(self) -> int:
        self._num_calls = getattr(self, "_num_calls", 0) + 1
        return self._num_calls

    def _rollouts(self, rows: list[dict], n: int, greedy: bool) -> tuple[RolloutBatch, list]:
        """``n`` rollouts of each row and their scores (futures of RewardResults): completions scored by the reward
        pool, or episodes scored by their environment."""
        if self.episodes is None:
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
        # an environment's failure is the episode's (env_error), not a scoring error
        results = [
            RewardResult(
                float(batch.rewards[i]),
                answer_ok=bool(batch.extras["answer_ok"][i]),
                info={"lenient_ok": bool(batch.extras["lenient_ok"][i])},
            )
            for i in range(len(batch))
        ]
        return batch, Scorer.done(results)

    def evaluate(self, max_items: int | None = None, threads: int | None = None) -> dict:
        """Greedy accuracy on this producer's share of the held-out rows (strict and lenient), with ``threads`` CPU
        threads (None: this actor's own)."""
        with self.threads.running(None, threads):
            self._withdraw()  # greedy rows of the held-out set, alone in the engine
            return self._evaluate(max_items)

    def _evaluate(self, max_items: int | None) -> dict:
        indices = list(range(len(self.eval_rows)))[self.idx :: self.num_producers][:max_items]
        if not indices:
            return {
                "count": 0,
                "strict_correct": 0,
                "lenient_correct": 0,
                "reward_errors": 0,
                "first_error": "",
                "items": [],
            }
        ok, lenient, errors, first_error, items = 0, 0, 0, "", []
        for lo in range(0, len(indices), self.microbatch_size):
            chunk = indices[lo : lo + self.microbatch_size]
            batch, scored = self._rollouts([self.eval_rows[i] for i in chunk], 1, greedy=True)
            for j, (index, f) in enumerate(zip(chunk, scored, strict=True)):
                r = f.result()
                ok += bool(r.answer_ok)
                lenient += bool(r.info.get("lenient_ok", r.answer_ok))
                errors += bool(r.info.get("error"))
                first_error = first_error or str(r.info.get("error") or "")
                row = self.eval_rows[index]
                items.append(
                    {
                        "index": index,
                        "prompt": row.get("prompt", row.get("messages")),
                        "response": self.tokenizer.decode(
                            batch.response_ids[j, : batch.response_lengths[j]].tolist(), skip_special_tokens=True
                        ),
                        "reference": row.get("gt_answer"),
                        "strict_ok": bool(r.answer_ok),
                        "lenient_ok": bool(r.info.get("lenient_ok", r.answer_ok)),
                    }
                )
        return {
            "count": len(indices),
            "strict_correct": ok,
            "lenient_correct": lenient,
            "reward_errors": errors,
            "first_error": first_error,
            "items": items,
        }

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
        totals = {
            "transfers": 0,
            "nbytes": 0,
            "direct_bytes": 0,
            "in_place_bytes": 0,
            "receive_s": 0.0,
            "paused_s": 0.0,
            "attest_s": 0.0,
        }
        load_threads = 0
        fingerprints: dict | None = {}
        for name in self.weight_groups:
            if self.lora is None:
                got = self.backend.receive_weights(name, threads)
                load_threads = max(load_threads, got.get("load_threads", 0))
            else:
                got = self.backend.receive_adapter(name, self.lora)
            held = got.get("fingerprints")
            fingerprints = None if held is None or fingerprints is None else {**fingerprints, **held}
            self.version = got["version"]
            for k in totals:
                totals[k] += got.get(k, 0)
        # What the engine computes with, sampled for the driver to attest the push (None: this engine cannot tell).
        out = {"version": self.version, "fingerprints": fingerprints, "weights/attest_s": totals.pop("attest_s")}
        if totals["receive_s"]:  # an engine that times its pushes: how long, and how long generation stood still
            out.update(
                {
                    "weights/receive_s": totals["receive_s"],
                    "weights/paused_s": totals["paused_s"],
                    "weights/load_threads": load_threads,
                }
            )
        if totals["nbytes"]:
            n = totals["nbytes"]
            out.update(
                {
                    "weights/transfers": totals["transfers"],
                    "weights/bytes": n,
                    "weights/direct_fraction": totals["direct_bytes"] / n,
                    "weights/in_place_fraction": totals["in_place_bytes"] / n,
                }
            )
        return out

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
        self._withdraw()
        state = {
            "cursor": self.cursor.state(),
            "calls": getattr(self, "_num_calls", 0),
            "version": self.version,
            "torch_rng": torch.get_rng_state(),
        }
        state.update(self.scorer.state())
        return state

    def restore(self, state: dict) -> None:
        self.cursor.restore(state["cursor"])
        self._num_calls = state["calls"]
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"])
        self.scorer.restore(state)

    def close(self) -> None:
        self.scorer.close()
        if self.episodes is not None:
            self.episodes.close()
