"""The processes of sandboxed runs, seen from the host: the uids runs take (one per run, from a block per process),
clearing what a run left under its uid, reaping the orphans of killed sandboxes, and killing a run's process group.
Used by ``sandbox``; no policy of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


def become_subreaper() -> None:
    """Orphans of a killed sandbox (bwrap's inner processes) are re-parented to us rather than to PID 1, which in
    some containers never reaps them: without this, zombies pile up and exhaust the sandbox uid's process budget."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_orphans() -> None:
    """Reap zombie bwrap processes re-parented to this process (only those: other children keep their status)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat_line = f.read()
        except OSError:
            continue
        comm_end = stat_line.rfind(")")
        comm = stat_line[stat_line.find("(") + 1 : comm_end]
        fields = stat_line[comm_end + 2 :].split()
        if comm == "bwrap" and fields[0] == "Z" and int(fields[1]) == me:
            try:
                os.waitpid(int(entry), os.WNOHANG)
            except ChildProcessError:
                pass


UIDS_PER_PROCESS = 16
"""sandboxed runs one process may have at once (reward workers and environment threads), each under its own uid"""


class SandboxUids:
    """The uids of one process's sandboxed runs, one per run at a time, so that RLIMIT_NPROC (counted per uid) keeps
    one run's fork bomb from starving any other run, and a uid is used again only once its last run left nothing
    behind. Each process has its own block: 100000 + (pid mod 20000) x UIDS_PER_PROCESS."""

    def __init__(self, pid: int):
        self.pid = pid
        base = 100000 + (pid % 20000) * UIDS_PER_PROCESS
        self.block = range(base, base + UIDS_PER_PROCESS)
        self.free = list(self.block)
        self.ready = threading.Condition()

    def acquire(self, timeout_s: float = 60.0) -> int:
        with self.ready:
            if not self.ready.wait_for(lambda: self.free, timeout=timeout_s):
                raise RuntimeError(f"no sandbox uid free within {timeout_s:g} s: {UIDS_PER_PROCESS} runs at once "
                                   "in this process, or uids whose programs would not die")  # fmt: skip
            return self.free.pop()

    def release(self, uid: int, clean: bool) -> None:
        with self.ready:
            if clean:
                self.free.append(uid)
                self.ready.notify()


_UIDS: SandboxUids | None = None
_UIDS_LOCK = threading.Lock()


def sandbox_uids() -> SandboxUids:
    """This process's uid block (a forked child gets a block of its own)."""
    global _UIDS
    with _UIDS_LOCK:
        if _UIDS is None or _UIDS.pid != os.getpid():
            _UIDS = SandboxUids(os.getpid())
        return _UIDS


def processes_of(uid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, state letter) of every process whose real uid is ``uid``, zombies included."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except (OSError, ValueError):
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            found.append((int(entry), int(fields["PPid"]), fields["State"].split()[0]))
    return found


def clear_uid(uid: int, timeout_s: float = 2.0) -> int:
    """Kill every process left under ``uid`` and reap the zombies re-parented here, until none is left or
    ``timeout_s`` passes; returns how many remain. RLIMIT_NPROC counts a uid's live processes and its unreaped
    zombies, and a fork bomb's processes outlive the kill of its group by a moment: a program started then under the
    same uid could not fork."""
    me, deadline = os.getpid(), time.monotonic() + timeout_s
    while True:
        left = processes_of(uid)
        for pid, parent, state in left:
            try:
                if state != "Z":
                    os.kill(pid, signal.SIGKILL)
                elif parent == me:
                    os.waitpid(pid, os.WNOHANG)
            except (ProcessLookupError, PermissionError, ChildProcessError):
                pass
        if not left or time.monotonic() > deadline:
            return len(left)
        time.sleep(0.002)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the sandbox's process group (bwrap's --die-with-parent and pid namespace take the rest down)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
