"""Reward models in Ray actors of their own: the server (one ``RewardModel`` per actor, with its own resources and
threads) and the producers' client, which spreads a batch over the servers (reward-model or judge servers alike) and
names the one that died or stopped answering instead of returning zeros.
"""

from __future__ import annotations

import time

import torch

from coati.distributed.reward.reward_model import RewardModel
from coati.distributed.runtime.liveness import HEARTBEAT_S, Stall, note_progress, start_heartbeat, watchdog_name
from coati.distributed.runtime.placement import whereabouts
from coati.distributed.runtime.startup import mark, marks


class RewardModelServer:
    """Hosts one reward model; run as a Ray actor (``ray.remote(RewardModelServer)``)."""

    def __init__(self, path: str, batch_size: int = 8, max_tokens: int | None = None, threads: int = 1):
        mark("imported")
        start_heartbeat()
        mark("setup")
        torch.set_num_threads(threads)
        self.model = RewardModel(
            path, batch_size=batch_size, max_tokens=max_tokens, device="cuda" if torch.cuda.is_available() else "cpu"
        )
        mark("engine")
        mark("ready")

    def score(self, prompts: list, completions: list[str]) -> list[tuple[float, str]]:
        """(score, note) per pair; the note says when the pair was cut to the model's limit (else "")."""
        scores = self.model.score(prompts, completions, on_batch=note_progress)
        cut = f"truncated to the reward model's last {self.model.max_tokens} tokens"
        return [(s, cut if t else "") for s, t in zip(scores, self.model.truncated, strict=True)]

    def ping(self) -> dict:
        """Answered once the model has loaded: the server's start-up marks (``startup``)."""
        return {**whereabouts(), "startup": marks()}


class RewardModelClient:
    """A producer's handle on the reward-model servers: ``score`` splits the pairs evenly over them and raises naming
    the server that died, or that finished no batch for ``timeout_s`` (named ``setting`` in the error); one that keeps
    scoring, for this producer or another, is waited for however long the draw takes. Outside a run, with no watchdog
    to ask, each server's share must come back within ``timeout_s``."""

    def __init__(
        self,
        servers: list,
        names: list[str],
        timeout_s: float,
        setting: str = "reward.rm.timeout_s",
        label: str = "reward model server",
    ):
        assert servers and len(servers) == len(names), (len(servers), names)
        self.servers, self.names, self.timeout_s, self.setting = list(servers), list(names), timeout_s, setting
        self.label = label
        """what the servers are, in errors (a teacher's servers answer ``score`` as well)"""

    def score(self, prompts: list, completions: list[str], *columns: list) -> list:
        """The servers' (score, note) pairs, in order (a note: a judge reply left unread, a reward-model input cut)."""
        k = len(self.servers)
        bounds = [len(prompts) * i // k for i in range(k + 1)]
        parts = [(i, bounds[i], bounds[i + 1]) for i in range(k) if bounds[i] < bounds[i + 1]]
        extra = list(columns)  # per-pair columns after the completions (a judge's references and rubrics)
        refs = [
            self.servers[i].score.remote(prompts[lo:hi], completions[lo:hi], *[x[lo:hi] for x in extra])
            for i, lo, hi in parts
        ]
        out = []
        for (i, _, _), ref in zip(parts, refs, strict=True):
            out += self._wait(self.names[i], ref)
        return out

    def _wait(self, name: str, ref) -> list:
        """``ref``'s result, waited for in slices while server ``name`` finishes batches (its heartbeat's count)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        watchdog, stall = _watchdog_of(name), Stall()
        while True:
            try:
                return ray.get(ref, timeout=min(HEARTBEAT_S, max(stall.since + self.timeout_s - time.monotonic(), 0.0)))
            except GetTimeoutError:
                pass
            except RayActorError as e:
                raise RuntimeError(f"{self.label} {name} died: {e}") from e
            done = None if watchdog is None else ray.get(watchdog.progress.remote([name]), timeout=30).get(name)
            stalled = stall.seconds(done)
            if stalled >= self.timeout_s:
                raise RuntimeError(
                    f"{self.label} {name} finished no batch for {stalled:.0f} s while alive "
                    f"({self.setting}={self.timeout_s:g})"
                )


def _watchdog_of(name: str):
    """The watchdog of the run server ``name`` belongs to, or None (a server started outside a run)."""
    import ray

    try:
        return ray.get_actor(watchdog_name(name))
    except ValueError:
        return None
