"""RewardPool: reward functions run in worker processes, so rewards overlap generation and never block or crash a
producer.

Each worker is a single-threaded process (math_verify's signal-based timeouts need a main thread). A dispatcher thread
feeds idle workers from a bounded queue (``submit`` blocks when it is full: back-pressure), enforces a wall-clock
limit per item by killing the worker, and replaces any worker that dies; the item it held fails, with the reason in
``info['error']`` (a failed item is left out of its group's statistics and the loss, not trained as a 0). Results come
back as futures.

A worker is a fresh interpreter that imports this module and the reward function only: multiprocessing's spawn would
also re-run the parent's main module, which in a Ray actor is Ray's worker script (about half a second of CPU at
every producer start).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from coati.distributed.reward.base import (
    DEFAULT_MAX_REWARD,
    TRAINER_FIELDS,
    RewardResult,
    RewardSignature,
    as_result,
    call_reward,
    follows_trl,
    max_reward_of,
    resolve_reward_fn,
    truncate_for_log,
)

log = logging.getLogger(__name__)


_BOOT = (
    "import sys\nfrom multiprocessing.connection import Connection\nconn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\nfrom coati.distributed.reward.pool import _worker_main\n"
    "_worker_main(conn, *conn.recv())"
)
"""a worker's program: its end of the pipe is the descriptor in argv; it takes the parent's import path, then the
reward function's name and options"""


def _worker_main(conn, fn_name: str, fn_kwargs: dict) -> None:
    fn = resolve_reward_fn(fn_name)
    signature = RewardSignature.of(fn, fn_name)
    max_reward = max_reward_of(fn, fn_name)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        task_ids, completions, fields = msg
        try:
            conn.send((task_ids, _call(fn, fn_name, signature, completions, fields, fn_kwargs, max_reward), None))
        except Exception as e:  # noqa: BLE001 - a reward bug scores 0 with its reason, the producer goes on
            conn.send((task_ids, None, f"{type(e).__name__}: {truncate_for_log(str(e))}"))


def _call(
    fn,
    fn_name: str,
    signature: RewardSignature,
    completions: list,
    fields: list[dict],
    fn_kwargs: dict,
    max_reward: float = DEFAULT_MAX_REWARD,
) -> list[RewardResult]:
    """One call of ``fn`` on a batch: each field a list with one value per completion, but ``trainer_state``, one
    object for the call (as a trainer passes it; the batch's items share it)."""
    columns = {k: fields[0][k] if k == "trainer_state" else [f[k] for f in fields] for k in fields[0]}
    out = call_reward(fn, signature, completions, columns, fn_kwargs)
    if out is None or len(out) != len(completions):
        got = "None" if out is None else f"{len(out)} results"
        raise ValueError(
            f"reward function {fn_name} returned {got} for {len(completions)} completions; it must "
            "return one result per completion"
        )
    return [as_result(result, fn_name, max_reward) for result in out]


@dataclass
class _Item:
    """A completion waiting to be scored, with its future."""

    task_id: int
    completion: object
    fields: dict
    fut: Future
    alone: bool = False
    """scored in a call of its own (a batch it was in failed: its failure is then its own)"""

    def joins(self, first: _Item) -> bool:
        """It may share ``first``'s call: the same fields and the same trainer state."""
        return (
            not self.alone
            and not first.alone
            and self.fields.keys() == first.fields.keys()
            and self.fields.get("trainer_state") == first.fields.get("trainer_state")
        )


class _Worker:
    """One worker process and its end of the pipe. A worker whose parent dies reads end-of-file and exits."""

    def __init__(self, fn_name: str, fn_kwargs: dict):
        ours, theirs = socket.socketpair()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send((fn_name, fn_kwargs))
        self.task: tuple[list[_Item], float] | None = None
        """the items it is scoring and their deadline"""

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """The worker's exit code, waiting up to ``wait_s`` for it to exit; None while it runs."""
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if self.exit_code(wait_s=5.0) is None:
            log.warning("reward worker %d did not exit within 5 s of SIGKILL", self.proc.pid)
        self.conn.close()


class RewardPool:
    """Score completions with reward function ``fn_name`` in ``num_workers`` processes, up to ``batch_size``
    completions per call (those waiting together that share their fields; a call's time limit is
    ``item_timeout_s`` whatever its size). A call of several that fails, by an error, a timeout or a dead worker,
    is retried one completion per call, so each completion's failure is its own."""

    def __init__(
        self,
        fn_name: str,
        num_workers: int = 2,
        item_timeout_s: float = 30.0,
        max_pending: int = 1024,
        fn_kwargs: dict | None = None,
        batch_size: int = 1,
    ):
        signature = RewardSignature.of(resolve_reward_fn(fn_name), fn_name)  # fails here, in the caller
        self.wants = {name for name in TRAINER_FIELDS if signature.wants(name)}
        """the trainer fields (``TRAINER_FIELDS``) the function names: only those are passed to it"""
        self.follows_trl = follows_trl(fn_name)
        if num_workers < 1 or batch_size < 1:
            raise ValueError(f"num_workers and batch_size must be >= 1, got {num_workers}, {batch_size}")
        self.fn_name = fn_name
        self.fn_kwargs = dict(fn_kwargs or {})
        self.item_timeout_s = item_timeout_s
        self.batch_size = batch_size
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._waiting: deque[_Item] = deque()  # taken from the queue by the dispatcher, not yet sent
        self._ids = itertools.count()
        self._workers = [_Worker(fn_name, self.fn_kwargs) for _ in range(num_workers)]
        self._closed = threading.Event()
        self.replaced_workers = 0
        self.calls = 0
        """calls of the function sent to workers (a batch is one)"""
        self._thread = threading.Thread(target=self._dispatch, name="reward-pool", daemon=True)
        self._thread.start()

    def submit(self, completion: str, fields: dict, conversational: bool = False) -> Future:
        """Queue one completion with its sample fields (the trainer fields the function does not name left out);
        a function that follows TRL's conventions gets a ``conversational`` row's completion as a message list.
        Blocks while ``max_pending`` submissions wait."""
        return self.submit_many([(completion, fields, conversational)])[0]

    def submit_many(self, items: list[tuple[str, dict, bool]]) -> list[Future]:
        """Queue several ``(completion, fields, conversational)`` at once (a group's completions), so they can
        share calls; their futures in order."""
        if self._closed.is_set():
            raise RuntimeError("RewardPool is closed")
        batch = []
        for completion, fields, conversational in items:
            fields = {k: v for k, v in fields.items() if k not in TRAINER_FIELDS or k in self.wants}
            if conversational and self.follows_trl:
                completion = [{"role": "assistant", "content": completion}]
            batch.append(_Item(next(self._ids), completion, fields, Future()))
        self._queue.put(batch)
        return [item.fut for item in batch]

    def score(self, completions: list[str], fields: dict[str, list]) -> list[RewardResult]:
        """Score a batch; ``fields`` maps each column name to one value per completion."""
        for name, values in fields.items():
            if len(values) != len(completions):
                raise ValueError(f"field {name!r} has {len(values)} values for {len(completions)} completions")
        futures = self.submit_many(
            [(c, {k: v[i] for k, v in fields.items()}, False) for i, c in enumerate(completions)]
        )
        return [f.result() for f in futures]

    def _fail(self, fut: Future, reason: str, timeout: bool = False) -> None:
        log.warning("reward item failed (left out of its group): %s", reason)
        fut.set_result(RewardResult(0.0, False, False, {"error": reason, "timeout": timeout}))

    def _failed(self, items: list[_Item], reason: str, timeout: bool = False) -> None:
        """A call failed: a single item fails with the reason; several go back to be scored one by one."""
        if len(items) == 1:
            self._fail(items[0].fut, reason, timeout)
            return
        log.info("a reward call of %d completions failed (%s); scoring them one per call", len(items), reason)
        for item in reversed(items):
            item.alone = True
            self._waiting.appendleft(item)

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = _Worker(self.fn_name, self.fn_kwargs)
        self.replaced_workers += 1

    def _next_call(self) -> list[_Item]:
        """The items of the next call: the first waiting item and those after it that may join it."""
        while len(self._waiting) < self.batch_size:
            try:
                self._waiting.extend(self._queue.get_nowait())
            except queue.Empty:
                break
        if not self._waiting:
            return []
        first = self._waiting.popleft()
        items = [first]
        for item in list(self._waiting):
            if len(items) == self.batch_size:
                break
            if item.joins(first):
                items.append(item)
                self._waiting.remove(item)
        return items

    def _dispatch(self) -> None:
        while not self._closed.is_set():
            for w in self._workers:
                if w.task is None:
                    items = self._next_call()
                    if not items:
                        break
                    try:
                        w.conn.send(
                            ([x.task_id for x in items], [x.completion for x in items], [x.fields for x in items])
                        )
                    except (BrokenPipeError, OSError):  # it died while idle: its items wait for its replacement
                        self._waiting.extendleft(reversed(items))
                        log.warning("reward worker %d died while idle (exit code %s)", w.proc.pid, w.exit_code(5.0))
                        self._replace(self._workers.index(w))
                        continue
                    self.calls += 1
                    w.task = (items, time.monotonic() + self.item_timeout_s)
            busy = [w for w in self._workers if w.task is not None]
            if not busy:
                time.sleep(0.002)
                continue
            ready = wait([w.conn for w in busy], timeout=0.01)  # a worker's death closes its pipe: ready too
            now = time.monotonic()
            for i, w in enumerate(self._workers):
                if w.task is None:
                    continue
                items, deadline = w.task
                if w.conn in ready:
                    try:
                        got_ids, results, error = w.conn.recv()
                    except (EOFError, OSError):
                        w.task = None
                        code = w.exit_code(wait_s=5.0)  # its pipe closed: it is exiting
                        self._failed(items, f"reward worker died (exit code {code})")
                        self._replace(i)
                        continue
                    assert got_ids == [x.task_id for x in items], (got_ids, items)
                    w.task = None
                    if error is not None:
                        self._failed(items, error)
                    else:
                        for item, result in zip(items, results, strict=True):
                            item.fut.set_result(result)
                elif (code := w.exit_code()) is not None:
                    w.task = None
                    self._failed(items, f"reward worker died (exit code {code})")
                    self._replace(i)
                elif now > deadline:
                    w.task = None
                    self._failed(
                        items, f"reward timed out after {self.item_timeout_s:.1f} s; worker killed", timeout=True
                    )
                    self._replace(i)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        for w in self._workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            w.kill()
        for w in self._workers:
            self._waiting.extend(w.task[0] if w.task else [])
        while True:
            try:
                self._waiting.extend(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in self._waiting:
            if not item.fut.done():
                self._fail(item.fut, "RewardPool closed before this item was scored")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RewardPools:
    """The run's reward function and the further reward functions among its components (TRL's list of reward
    functions), each in a pool of its own: one ``submit`` scores a completion with all of them. The future holds the
    first function's RewardResult with the others' values in ``info["components"]`` ({name: reward, or None for no
    score}); any one's failure is the completion's (``info["error"]``, named by the function)."""

    def __init__(self, main: RewardPool, others: dict[str, RewardPool]):
        self.main, self.others = main, dict(others)
        self.wants = set(main.wants).union(*(p.wants for p in self.others.values()))

    def submit(self, completion: str, fields: dict, conversational: bool = False) -> Future:
        return self.submit_many([(completion, fields, conversational)])[0]

    def submit_many(self, items: list[tuple[str, dict, bool]]) -> list[Future]:
        firsts = self.main.submit_many(items)
        others = {name: pool.submit_many(items) for name, pool in self.others.items()}
        return [self._joined(first, {name: futs[i] for name, futs in others.items()}) for i, first in enumerate(firsts)]

    @staticmethod
    def _joined(first_fut: Future, others: dict[str, Future]) -> Future:
        """A future of the first function's result with the others' values in ``info["components"]``."""
        futures = [first_fut, *others.values()]
        out: Future = Future()
        pending, lock = [len(futures)], threading.Lock()

        def done(_) -> None:
            with lock:
                pending[0] -= 1
                if pending[0]:
                    return
            first = first_fut.result()
            info, components = dict(first.info), {}
            for name, fut in others.items():
                result = fut.result()
                components[name] = None if result.info.get("no_score") else result.reward
                if result.info.get("error") and not info.get("error"):
                    info.update(error=f"{name}: {result.info['error']}", timeout=bool(result.info.get("timeout")))
            info["components"] = components
            out.set_result(RewardResult(first.reward, first.format_ok, first.answer_ok, info))

        for fut in futures:
            fut.add_done_callback(done)
        return out

    def close(self) -> None:
        for pool in (self.main, *self.others.values()):
            pool.close()
