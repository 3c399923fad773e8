"""The run itself: preflight checks, actor start-up, weight group, and the produce -> consume -> push loop.

The loop keeps scored groups in a ``RolloutBuffer`` (``rollout_buffer.py``). A step takes ``train_batch_size *
dp_size`` groups from it (drawing more rollouts while it is short: DAPO's dynamic sampling drops zero-signal groups and
refills instead of skipping steps), trains, and pushes weights. With ``max_staleness = k >= 1`` the producers keep
rolling out with the weights they hold while the consumers train, up to k steps' worth of groups ahead; every row
records the weight version that sampled it, and no row more than k versions behind the weights it is trained from is
trained.
"""

from __future__ import annotations

import logging
import os
import time
import numpy as np

from coati.distributed.config import LaunchConfig
from coati.distributed.guards import RewardFailure, all_finite, check_reward_failures, reward_failures
from coati.distributed.preflight import Plan
from coati.distributed.rollout import RolloutBatch
from coati.distributed.rollout_buffer import DrawLog, RolloutBuffer

log = logging.getLogger(__name__)
MAX_DRAWS_PER_STEP = 8
"""draw rounds a step may make, per round its batch needs when nothing is dropped, before zero-signal groups fill it"""


class RunError(RuntimeError):
    """An actor died, failed or stopped answering; the message names it and the last checkpoint."""


STEP_TIMEOUT_S = 3600.0


ACTOR_NAMES: dict[str, str] = {}
"""actor id (hex) -> the name the driver gave it, for error messages"""


def _get(refs, what: str, timeout: float | None = STEP_TIMEOUT_S):
    """ray.get bounded in time, with failures re-raised as RunError naming what was being waited for."""
    import ray

    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayActorError as e:
        name = ACTOR_NAMES.get(getattr(e, "actor_id", None) or "", getattr(e, "actor_id", "unknown"))
        raise RunError(f"{what}: actor {name} died ({_first_line(e)})") from e
    except ray.exceptions.RayTaskError as e:
        raise RunError(f"{what} failed: {_first_line(e)}") from e
    except ray.exceptions.GetTimeoutError as e:
        raise RunError(f"{what}: no answer within {timeout:.0f} s") from e


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    tail = [line for line in text if "Error" in line]
    return (tail[-1] if tail else text[0] if text else type(e).__name__)[:500]


class Run:
    def __init__(self, cfg: LaunchConfig, plan: Plan, *, seed, weight_sync_timeout_s, max_staleness, master_addr,
                 master_port, run_name, sleep_while_training=False):  # fmt: skip
        self.cfg, self.plan, self.seed = cfg, plan, seed
        self.timeout_s, self.max_staleness = weight_sync_timeout_s, max_staleness
        self.sleep_while_training = sleep_while_training
        self.master_addr, self.master_port, self.run_name = master_addr, master_port, run_name
        self.producers, self.consumers = [], []
        self.shared_gpus: dict[int, object] = {}
        self.version = 0
        self.push_stats: dict = {}
        self.start_step = 0
        self.last_checkpoint: str | None = None
        a = cfg.algorithm
        self.buffer = RolloutBuffer(cfg.global_train_batch_size, cfg.producer.num_generations, max_staleness,
                                    a.dynamic_sampling, a.dynamic_sampling_signal, MAX_DRAWS_PER_STEP)  # fmt: skip
        self.record: dict = {}
        """the config and identity a checkpoint records (set by the driver)"""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path)

    def start_actors(self) -> None:
        import ray

        from coati.distributed.consumer import GRPOConsumer
        from coati.distributed.placement import actor_options, reserve_shared_gpus
        from coati.distributed.producer import Producer

        # The driver's folder goes on the actors' path so user reward modules (module:function) import there too.
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
        env = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
                                            "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}}}  # fmt: skip
        c, p = self.cfg, self.plan
        self.shared_gpus = reserve_shared_gpus(p.producer_slots + p.consumer_slots)
        for i, slot in enumerate(p.producer_slots):
            options = actor_options(slot, self.shared_gpus)
            actor = ray.remote(Producer).options(**options, **env, name=f"{self.run_name}-producer-{i}")
            self.producers.append(actor.remote(
                i, c.producer.num_producers, p.inference_model_path, c.producer.backend, c.generation, c.algorithm,
                p.train_dataset, c.reward, c.producer.num_generations, c.producer.inference_microbatch_size,
                system_prompt=p.system_prompt,
                eval_dataset=p.eval_dataset, seed=self.seed,
                backend_options=p.inference_options,
            ))  # fmt: skip
        world = c.consumer.num_consumer_procs
        addr = self.master_addr or p.consumer_slots[0].address
        port = self.master_port or _free_port()
        for rank, slot in enumerate(p.consumer_slots):
            options = actor_options(slot, self.shared_gpus)
            actor = ray.remote(GRPOConsumer).options(**options, **env, name=f"{self.run_name}-consumer-{rank}")
            self.consumers.append(actor.remote(rank, world, addr, port, p.train_model_path, c.consumer, c.algorithm,
                                               c.generation, c.producer.num_generations, seed=self.seed))  # fmt: skip
        for i, a in enumerate(self.producers):
            ACTOR_NAMES[a._actor_id.hex()] = f"{self.run_name}-producer-{i}"
        for i, a in enumerate(self.consumers):
            ACTOR_NAMES[a._actor_id.hex()] = f"{self.run_name}-consumer-{i}"
        self.producer_info = _get([a.setup.remote() for a in self.producers], "producer setup")
        self.consumer_info = _get([a.setup.remote() for a in self.consumers], "consumer setup")

    def connect_weight_group(self) -> None:
        """One weight group per consumer pipeline stage: its sender (DP rank 0, TP rank 0) plus every producer."""
        from coati.distributed.placement import weight_backend

        backend = weight_backend(self.plan.producer_slots, self.plan.consumer_slots)
        stages = sorted({info["pp_rank"] for info in self.consumer_info})
        self.senders = [
            next(i for i, info in enumerate(self.consumer_info)
                 if info["pp_rank"] == s and info["dp_rank"] == 0 and info["tp_rank"] == 0)
            for s in stages
        ]  # fmt: skip
        groups = [f"{self.run_name}-weights-stage{s}" for s in stages]
        from coati.distributed.inference import backend_class

        # Engines with worker processes (vLLM) put each of them in the group; the others one process per producer.
        per = backend_class(self.cfg.producer.backend).weight_ranks(self.plan.inference_options)
        world = 1 + len(self.producers) * per
        refs = [self.consumers[i].join_weight_group.remote(world, g, backend, self.timeout_s)
                for i, g in zip(self.senders, groups)]  # fmt: skip
        refs += [p.join_weight_groups.remote(world, 1 + i * per, groups, backend, self.timeout_s)
                 for i, p in enumerate(self.producers)]  # fmt: skip
        _get(refs, "joining the weight groups")

    def push_weights(self) -> float:
        start = time.perf_counter()
        refs = [c.push_weights.remote(self.version) for c in self.consumers]
        refs += [p.receive_weights.remote() for p in self.producers]
        received = _get(refs, f"weight push {self.version}")[len(self.consumers) :]
        # How the push travelled, as producer 0 saw it (all producers receive the same transfers).
        self.push_stats = {k: v for k, v in received[0].items() if k.startswith("weights/")}
        return time.perf_counter() - start

    # ---- checkpoints -------------------------------------------------------------------------------------------

    def checkpoint(self, manager, step: int) -> str:
        from coati.distributed.checkpoint import config_dict, save_driver_state

        import shutil

        folder = manager.staging(step)
        try:
            _get([c.save_checkpoint.remote(str(folder)) for c in self.consumers], f"checkpoint {step} (consumers)")
            states = _get([p.state.remote() for p in self.producers], f"checkpoint {step} (producers)")
            save_driver_state(folder, self.buffer.state(), states)
        except (RunError, OSError) as e:
            free = shutil.disk_usage(manager.root).free / 2**20
            raise RunError(f"writing checkpoint {folder} failed: {e} ({manager.root} has {free:.0f} MiB free)") from e
        meta = {"step": step, "version": self.version, "config": config_dict(self.cfg), "run_name": self.run_name,
                "identity": self.record.get("identity", {})}  # fmt: skip
        self.last_checkpoint = str(manager.commit(folder, step, meta))
        return self.last_checkpoint

    def restore(self, folder: str) -> int:
        """Load a checkpoint (already checked against this run by the driver) into the running actors; returns the
        step it was taken after."""
        import json
        from pathlib import Path

        from coati.distributed.checkpoint import load_driver_state

        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        _get([c.load_checkpoint.remote(str(folder)) for c in self.consumers], f"loading {folder} (consumers)")
        state = load_driver_state(folder)
        if len(state["producers"]) != len(self.producers):
            raise ValueError(f"checkpoint has {len(state['producers'])} producers, this run {len(self.producers)}")
        _get([p.restore.remote(s) for p, s in zip(self.producers, state["producers"], strict=True)], "restoring producers")
        self.buffer.restore(state["buffer"])
        self.version = self.start_step = meta["step"]
        self.last_checkpoint = str(folder)
        return self.start_step

    # ---- rollouts --------------------------------------------------------------------------------------------

    def _draw_sizes(self, missing_groups: int) -> list[int]:
        """Prompts each producer draws in one round. Synchronous runs (k = 0) ask for no more than the step lacks, since
        a leftover group would be stale by the next step; otherwise every producer draws ``inference_batch_size``."""
        size, n = self.cfg.producer.inference_batch_size, len(self.producers)
        if self.max_staleness >= 1:
            return [size] * n
        missing = max(missing_groups, 1)
        return [min(size, missing // n + (i < missing % n)) for i in range(n)]

    def _draw(self, for_step: int, missing_groups: int) -> None:
        """One round: every producer with a share draws, and each draw is checked and admitted as it lands."""
        sizes = self._draw_sizes(missing_groups)
        refs = [p.generate.remote(k) for p, k in zip(self.producers, sizes, strict=True) if k > 0]
        log = self.buffer.log(for_step)
        log.draws += 1
        for batch in _get(refs, "rollout"):
            # Each producer's draw is checked as it lands, before any of it can be trained on.
            check_reward_failures(batch.extras, self.cfg.reward.fn, self.cfg.reward.max_error_fraction,
                                  self.cfg.reward.stop_on_first_step_error and self.version == self.start_step,
                                  f"rollout for step {for_step}")  # fmt: skip
            self.buffer.admit(batch, for_step)

    def _take(self, step: int) -> RolloutBatch:
        """The batch of ``step`` (trained from version step - 1), drawing while the buffer is short."""
        buf, draws = self.buffer, self.buffer.log(step)
        buf.drop_stale(step - 1, draws)
        per_draw = sum(self._draw_sizes(buf.groups_per_step))
        while buf.groups() < buf.groups_per_step:
            if draws.draws >= buf.draws_allowed(per_draw):
                short = buf.groups_per_step - buf.groups()
                buf.fill_short(draws)
                log.warning("dynamic sampling: %d draws left step %d short; filled with %d zero-signal groups",
                            draws.draws, step, short)  # fmt: skip
                break
            self._draw(step, buf.groups_per_step - buf.groups())
        return buf.take(step - 1)

    def _fill_while_training(self, train_refs, step: int, total: int) -> None:
        """While step ``step`` trains, roll out with the weights the producers hold (version step - 1) for the next
        steps, up to ``max_staleness`` steps' worth of groups (the pacing that keeps the bound), and only while
        training is still running."""
        import ray

        target = self.buffer.fill_target(total - step)
        while self.buffer.groups(step) < target:
            self._draw(step + 1, target - self.buffer.groups(step))
            done, _ = ray.wait(train_refs, num_returns=len(train_refs), timeout=0)
            if len(done) == len(train_refs):
                break

    # ---- loop ------------------------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        results = _get([p.evaluate.remote() for p in self.producers], "evaluation")
        count = sum(r["count"] for r in results)
        if not count:
            return {}
        errors = sum(r["reward_errors"] for r in results)
        if errors > self.cfg.reward.max_error_fraction * count:
            first = next(r["first_error"] for r in results if r["first_error"])
            raise RewardFailure(f"evaluation: reward function {self.cfg.reward.fn} failed on {errors} of {count} "
                                f"held-out items; first error: {first}")  # fmt: skip
        return {"eval/strict": sum(r.get("strict_correct", 0) for r in results) / count,
                "eval/lenient": sum(r.get("lenient_correct", 0) for r in results) / count, "eval/count": count,
                "eval/reward_errors": errors}  # fmt: skip

    def loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints: int = 2) -> dict:
        try:
            return self._loop(max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints)
        except RunError as e:
            raise RunError(f"{e}\nlast checkpoint: {self.last_checkpoint or 'none'}") from e

    def _loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints) -> dict:
        import ray

        from coati.distributed.checkpoint import CheckpointManager

        manager = CheckpointManager(os.path.join(save_dir, "checkpoints"), keep_checkpoints) if save_dir else None
        total = self.cfg.num_episodes * self.plan.steps_per_episode
        total = min(total, max_steps) if max_steps else total
        history, evals = [], []
        # With a held-out set: before training, at the end, and every eval_interval steps when that is > 0.
        if self.plan.eval_dataset and self.start_step == 0:
            evals.append({"step": 0, **self.evaluate()})
        for step in range(self.start_step + 1, total + 1):
            t0 = time.perf_counter()
            batch = self._take(step)
            t_rollout = time.perf_counter() - t0
            ref = ray.put(batch)
            asleep = self._sleep_producers() if self.sleep_while_training else {}
            train_refs = [c.train_step.remote(ref) for c in self.consumers]
            t1 = time.perf_counter()
            if self.max_staleness >= 1 and step < total:
                self._fill_while_training(train_refs, step, total)
            # With pipeline parallelism only the last stage sees the loss: report the fullest metrics.
            train_metrics = max(_get(train_refs, f"training step {step}"), key=len)
            t_train = time.perf_counter() - t1
            self.version = step
            if self.sleep_while_training:
                asleep["time/wake"] = self._wake_producers()
            t_push = self.push_weights()
            metrics = self._metrics(step, total, batch, self.buffer.logs.pop(step), train_metrics, t_rollout, t_train,
                                    t_push, t0)  # fmt: skip
            metrics.update(asleep)
            if self.plan.eval_dataset and ((eval_interval and step % eval_interval == 0) or step == total):
                evals.append({"step": step, **self.evaluate()})
                metrics.update(evals[-1])
            history.append(metrics)
            if on_step is not None:
                on_step(metrics)
            if manager is not None and ((save_interval and step % save_interval == 0) or step == total):
                self.checkpoint(manager, step)
        final = self.save(os.path.join(save_dir, "final")) if save_dir else None
        return {"history": history, "evals": evals, "final_model": final, "total_steps": total}

    def _sleep_producers(self) -> dict:
        """Producers free accelerator memory before consumers start training (they may share the GPUs)."""
        start = time.perf_counter()
        mem = _get([p.sleep.remote() for p in self.producers], "producers going to sleep")
        return {"time/sleep": time.perf_counter() - start,
                "inference/mem_awake_mb": max(m[0] for m in mem) / 2**20,
                "inference/mem_asleep_mb": max(m[1] for m in mem) / 2**20}  # fmt: skip

    def _wake_producers(self) -> float:
        start = time.perf_counter()
        _get([p.wake.remote() for p in self.producers], "producers waking")
        return time.perf_counter() - start

    def full_weights(self) -> dict:
        """The whole model's weights, merged from each pipeline stage's sender (all ranks join the TP gathers)."""
        states = _get([c.weights.remote() for c in self.consumers], "gathering weights")
        merged = {}
        for i in self.senders:
            merged.update(states[i])
        return merged

    def save(self, path: str) -> str:
        """Write a Hugging Face folder (weights, config, tokenizer) loadable by AutoModelForCausalLM, atomically."""
        import shutil

        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        state = self.full_weights()
        bad = [k for k, v in state.items() if not all_finite([v])]
        if bad:
            raise RunError(f"refusing to export {path}: non-finite weights in {bad[:5]} ({len(bad)} tensors)")
        config = AutoConfig.from_pretrained(self.plan.train_model_path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        model.tie_weights()
        still_meta = [n for n, p in model.named_parameters() if p.is_meta]
        assert not still_meta and not unexpected, (still_meta, unexpected)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
        except (OSError, RuntimeError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free / 2**20
            raise RunError(f"exporting {path} failed: {e} ({free:.0f} MiB free there)") from e
        if os.path.exists(path):
            shutil.rmtree(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        os.replace(tmp, path)
        return path

    def _metrics(self, step, total, batch, draws: DrawLog, train, t_rollout, t_train, t_push, t0) -> dict:
        """The step's metrics: ``reward/*`` and ``response/*`` over the rows drawn for this step (before filtering),
        ``reward/train_batch_mean`` and the lags over the rows it trained."""
        n = self.cfg.producer.num_generations
        drawn = RolloutBatch.concat(draws.rollouts) if draws.rollouts else batch
        lag = (step - 1) - batch.policy_version
        ex = drawn.extras
        out = {
            "step": step,
            "total_steps": total,
            "reward/mean": float(drawn.rewards.mean()),
            "reward/strict_accuracy": float(np.mean(ex["answer_ok"])) if "answer_ok" in ex else float("nan"),
            "reward/lenient_accuracy": float(np.mean(ex["lenient_ok"])) if "lenient_ok" in ex else float("nan"),
            "reward/train_batch_mean": float(batch.rewards.mean()),
            "response/length_mean": float(drawn.response_lengths.mean()),
            "response/truncated_frac": float(drawn.truncated.mean()),
            "response/tokens": int(drawn.response_lengths.sum()),
            "rollout/drawn_groups": len(drawn) // n,
            "rollout/draws": draws.draws,
            "rollout/dropped_zero_signal_groups": draws.dropped_zero_signal_groups,
            "rollout/filled_zero_signal_groups": draws.filled_zero_signal_groups,
            "rollout/stale_dropped_groups": draws.stale_dropped_groups,
            "rollout/policy_lag_mean": float(lag.mean()),
            "rollout/policy_lag_max": int(lag.max()),
            **reward_failures(ex),
            "time/rollout_wait": t_rollout,
            "time/train": t_train,
            "time/weight_push": t_push,
            "time/step": time.perf_counter() - t0,
            **self.push_stats,
        }
        for key in ("time/generate", "time/reward_wait", "time/producer_total"):
            if key in ex:
                out[key] = float(np.max(ex[key]))
        # Driver time that is none of: waiting for rollouts, training, pushing weights (batching, object store puts,
        # metrics). Rollout wait itself is generation + reward + transfer, reported by the producers above.
        out["time/overhead"] = max(out["time/step"] - t_rollout - t_train - t_push, 0.0)
        out.update({k: v for k, v in train.items()})
        for j, count in enumerate(np.bincount(lag[::n], minlength=self.max_staleness + 1)):
            out[f"rollout/lag{j}_groups"] = int(count)  # trained groups sampled j versions back
        out["rollout/prompt_index"] = batch.extras["prompt_index"][::n].tolist()
        out["samples"] = [
            {"prompt": self.tokenizer.decode(batch.prompt_ids[i][batch.prompt_mask[i]].tolist()),
             "response": self.tokenizer.decode(batch.response_ids[i, : batch.response_lengths[i]].tolist()),
             "reward": float(batch.rewards[i]), "policy_version": int(batch.policy_version[i])}
            for i in range(0, min(len(batch), 2 * n), n)
        ]  # fmt: skip
        return out

    def shutdown(self) -> None:
        import ray

        for a in self.producers:
            try:
                ray.get(a.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        for a in self.producers + self.consumers:
            ray.kill(a)
        for g in self.shared_gpus.values():
            ray.util.remove_placement_group(g)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
