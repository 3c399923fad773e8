"""The processes of sandboxed runs, seen from the host: the uids runs take (one per run, reserved across the
machine, never one a process already runs under), clearing what a run left under its uid, reaping the orphans of
killed sandboxes, and killing a run's process group. Used by ``sandbox``; no policy of its own.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import stat
import subprocess
import tempfile
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
    children = _children()
    for pid in children if children is not None else (int(e) for e in os.listdir("/proc") if e.isdigit()):
        fields = _stat_fields(pid)
        if fields is not None and fields[0] == "bwrap" and fields[1] == "Z" and fields[2] == me:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _children() -> list[int] | None:
    """This process's children, from each thread's /proc children list (an orphan is re-parented to one of the
    threads); None where the kernel has no such lists (then every process is looked at). A child that ends, or a
    thread that ends, while the lists are read may be missed: the next call sees it."""
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
        return None
    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as f:
                found += [int(p) for p in f.read().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _stat_fields(pid: int) -> tuple[str, str, int] | None:
    """(command name, state letter, parent pid) of ``pid`` from /proc/<pid>/stat, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
    except OSError:
        return None
    comm_end = line.rfind(b")")
    fields = line[comm_end + 2 :].split()
    try:
        return line[line.find(b"(") + 1 : comm_end].decode(errors="replace"), fields[0].decode(), int(fields[1])
    except (IndexError, ValueError):
        return None


UID_RANGE = range(100000, 420000)
"""uids sandboxed runs may take (as root, where runs switch to a uid of their own)"""
UIDS_PER_PROCESS = 16
"""sandboxed runs one process may have at once (reward workers and environment threads), each under its own uid"""


def _lock_folder() -> str:
    """The folder of the uid reservations, shared by every process of this user on the machine: /run/coati-uids as
    root (a folder no other user can create), else one in the temp folder; either must be a folder of this user's
    that no one else can write (else it is refused, naming it)."""
    base = "/run" if os.geteuid() == 0 and os.access("/run", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(base, f"coati-uids-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"the sandbox's uid reservations folder {path} is not a folder of this user's that only "
            f"it can write: remove it (it is made again)"
        )
    return path


def uids_in_use() -> set[int]:
    """The uid every process on the machine runs as (the owner of its /proc entry: one stat each, no file read)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    return found


class SandboxUids:
    """The uids of this process's sandboxed runs, one per run at a time, so that RLIMIT_NPROC (counted per uid) keeps
    one run's fork bomb from starving any other run. A uid is reserved across the machine by an exclusive lock on a
    file of its own (``_lock_folder``), so no two processes ever share one, and it is taken only when no process on
    the machine runs under it: the sandbox then kills only what it started. A uid whose leftovers would not die stays
    reserved while this process lives. The search starts at a place of this process's own in ``UID_RANGE``."""

    def __init__(self, pid: int):
        self.pid = pid
        self.folder = _lock_folder()
        self.start = UID_RANGE.start + (pid * UIDS_PER_PROCESS) % len(UID_RANGE)
        self.held: dict[int, int] = {}
        """uid -> the descriptor holding its lock, for this process's runs in progress (and uids never given back)"""
        self.lost: set[int] = set()
        self.ready = threading.Condition()

    @property
    def running(self) -> int:
        return len(self.held) - len(self.lost)

    def acquire(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        with self.ready:
            while True:
                if self.running < UIDS_PER_PROCESS:
                    uid = self._reserve()
                    if uid is not None:
                        return uid
                if (
                    not self.ready.wait(timeout=min(0.05, max(deadline - time.monotonic(), 0)))
                    and time.monotonic() > deadline
                ):
                    raise RuntimeError(
                        f"no sandbox uid free within {timeout_s:g} s: {UIDS_PER_PROCESS} runs at once "
                        "in this process, or uids whose programs would not die"
                    )

    def _reserve(self) -> int | None:
        busy = uids_in_use()
        for i in range(len(UID_RANGE)):
            uid = UID_RANGE.start + (self.start - UID_RANGE.start + i) % len(UID_RANGE)
            if uid in self.held or uid in busy:
                continue
            fd = os.open(
                os.path.join(self.folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if uid in uids_in_use():  # started under it since the scan, by someone else
                os.close(fd)
                continue
            self.held[uid] = fd
            return uid
        return None

    def release(self, uid: int, clean: bool) -> None:
        with self.ready:
            if clean:
                os.close(self.held.pop(uid))  # closing the descriptor drops the lock
                self.ready.notify()
            else:
                self.lost.add(uid)


_UIDS: SandboxUids | None = None
_UIDS_LOCK = threading.Lock()


def sandbox_uids() -> SandboxUids:
    """This process's uids (a forked child gets its own)."""
    global _UIDS
    with _UIDS_LOCK:
        if _UIDS is None or _UIDS.pid != os.getpid():
            _UIDS = SandboxUids(os.getpid())
        return _UIDS


def process_states(pids) -> list[tuple[int, int, str, int]]:
    """(pid, parent pid, state letter, real uid) of each of ``pids`` still there, zombies included."""
    found = []
    for pid in pids:
        try:
            fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            status = os.read(fd, 16384)  # the fields read here are in the first few hundred bytes
            found.append((pid, int(_field(status, b"PPid")), _field(status, b"State")[:1].decode(), _uid(status)))
        except (OSError, ValueError, IndexError):
            continue
        finally:
            os.close(fd)
    return found


def _field(status: bytes, name: bytes) -> bytes:
    """The value of one ``Name:\tvalue`` line of a /proc status file (ValueError when it has none)."""
    start = (b"\n" + status).index(b"\n" + name + b":") + len(name) + 1  # where the value starts in ``status``
    end = status.find(b"\n", start)
    return status[start : end if end >= 0 else len(status)].strip()


def _uid(status: bytes) -> int:
    return int(_field(status, b"Uid").split()[0])  # real, effective, saved, filesystem: the first is the real one


def processes_of(uid: int) -> list[tuple[int, int, str]]:
    """(pid, parent pid, state letter) of every process whose real uid is ``uid``, zombies included."""
    every = process_states(int(e) for e in os.listdir("/proc") if e.isdigit())
    return [(pid, parent, state) for pid, parent, state, owner in every if owner == uid]


def clear_uid(uid: int, timeout_s: float = 2.0) -> int:
    """Kill every process left under ``uid`` and reap the zombies re-parented here, until none is left or
    ``timeout_s`` passes; returns how many remain. RLIMIT_NPROC counts a uid's live processes and its unreaped
    zombies, and a fork bomb's processes outlive the kill of its group by a moment: a program started then under the
    same uid could not fork."""
    return kill_until_gone(lambda: processes_of(uid), timeout_s)


def kill_until_gone(members, timeout_s: float = 2.0) -> int:
    """Kill every process ``members()`` lists ((pid, parent pid, state) each) and reap its zombies re-parented here,
    until it lists none or ``timeout_s`` passes; returns how many remain."""
    me, deadline = os.getpid(), time.monotonic() + timeout_s
    while True:
        left = members()
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
    wait_exit(proc, 5.0)


def wait_exit(proc: subprocess.Popen, timeout_s: float, stdin: bytes | None = None) -> bool:
    """Write ``stdin`` to the process's stdin pipe and close it (it may stop reading or exit first), then wait for it
    to exit, all within ``timeout_s``; True when it exited in time. The wait is on a pidfd where the kernel has them,
    so it ends the moment the process does (``Popen.wait`` with a timeout polls with sleeps that double up to 50 ms,
    waking a run of 35 ms at 63 ms)."""
    deadline = time.monotonic() + timeout_s
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd here, or the process was already reaped
        pidfd = None
    try:
        if stdin is not None and proc.stdin is not None:
            if not _feed(proc.stdin, stdin, pidfd, deadline):
                return False
        if pidfd is None:
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
                return True
            except subprocess.TimeoutExpired:
                return False
        if not select.select([pidfd], [], [], max(deadline - time.monotonic(), 0))[0]:
            return False
        proc.wait()
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _feed(pipe, data: bytes, pidfd: int | None, deadline: float) -> bool:
    """Write ``data`` to ``pipe`` and close it, until the reader exits or stops reading; False at the deadline."""
    fd, view = pipe.fileno(), memoryview(data)
    os.set_blocking(fd, False)
    try:
        while view:
            waits = [pidfd] if pidfd is not None else []
            readable, writable, _ = select.select(waits, [fd], [], max(deadline - time.monotonic(), 0))
            if writable:
                try:
                    view = view[os.write(fd, view[:65536]) :]
                except BlockingIOError:
                    continue
                except OSError:  # the reader is gone (EPIPE): the rest of its input is not wanted
                    break
            elif readable:
                break  # exited without reading it all
            else:
                return False
        return True
    finally:
        try:
            pipe.close()
        except OSError:
            pass
