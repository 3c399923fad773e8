"""Signs of life: every actor of a run (producers, consumers, reward-model and judge servers) sends a heartbeat to the
run's ``Watchdog`` actor from a thread of its own every ``HEARTBEAT_S`` seconds, whatever its main thread is doing;
while the driver waits on actors it asks the watchdog which have been silent longer than ``run.hang_timeout_s``. A
busy actor keeps beating (its work releases the GIL between operations); a process that is stopped (SIGSTOP, a
debugger), stuck in native code holding the GIL, or gone stops, and the driver names it within the limit instead of
waiting out the longest a fan-out may take.

A beat also carries the actor's count of finished transfers (``note_progress``: each collective of a weight push,
each stage an engine loads, each batch a reward-model server scores), so the driver can tell a live actor that works
from a live actor that waits on something that never comes: a weight push whose collectives stop moving while every
actor beats stops the run after ``run.hang_timeout_s`` without a transfer (``actor_group.get``'s ``moving``), and a
producer stops waiting for a reward-model server that has scored nothing for ``reward.rm.timeout_s``.

An actor is named ``<run>-<role>-<i>``; its watchdog is ``<run>-watchdog``, started before the run's other actors.
"""

from __future__ import annotations

import threading
import time

HEARTBEAT_S = 2.0
"""seconds between an actor's heartbeats"""

_progress = [0]


def note_progress() -> None:
    """Count one finished transfer of this process (sent with its next heartbeat)."""
    _progress[0] += 1


def progress() -> int:
    """This process's finished transfers so far."""
    return _progress[0]


class Stall:
    """Seconds since a progress count (the watchdog's, ``Watchdog.progress``) last changed, by this process's clock:
    what a wait on a transfer or a server compares with its limit."""

    def __init__(self):
        self.count: int | None = None
        self.since = time.monotonic()

    def seconds(self, count: int | None) -> float:
        """Seconds without a change, given the count now (None: none known, so no change)."""
        now = time.monotonic()
        if count is not None and count != self.count:
            self.count, self.since = count, now
        return now - self.since


class Watchdog:
    """The last heartbeat of each actor of a run, by the watchdog's own clock."""

    def __init__(self):
        self.seen: dict[str, float] = {}
        self.done: dict[str, int] = {}

    def beat(self, name: str, done: int = 0) -> None:
        self.seen[name] = time.monotonic()
        self.done[name] = done

    def progress(self, names: list[str]) -> dict[str, int]:
        """{actor: finished transfers at its last heartbeat} for those of ``names`` that have beaten."""
        return {n: self.done[n] for n in names if n in self.done}

    def silent(self, limit_s: float) -> dict[str, float]:
        """{actor: seconds since its last heartbeat} of the actors silent longer than ``limit_s``."""
        now = time.monotonic()
        return {name: now - t for name, t in self.seen.items() if now - t > limit_s}


def watchdog_name(actor_name: str) -> str:
    """The watchdog of the run an actor named ``<run>-<role>-<i>`` belongs to."""
    return f"{actor_name.rsplit('-', 2)[0]}-watchdog"


def start_heartbeat(interval_s: float = HEARTBEAT_S) -> None:
    """In a Ray actor of a run (a named actor whose run has a watchdog), beat every ``interval_s`` from a daemon
    thread; elsewhere (a process that is not such an actor) nothing."""
    import ray

    try:
        name = ray.get_runtime_context().get_actor_name()
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return
    if not name or name.count("-") < 2:
        return
    try:
        watchdog = ray.get_actor(watchdog_name(name))
    except ValueError:  # a run started without one (an actor made by a test)
        return

    def beat() -> None:
        while True:
            try:
                watchdog.beat.remote(name, progress())
            except Exception:  # noqa: BLE001 - the run is shutting down
                return
            time.sleep(interval_s)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
