"""A control group per sandboxed run: its memory (tmpfs pages included) and its process count bounded for the whole
run, not per process, and the run killed by membership, so nothing outside it is touched.

Where the host lets this process create control groups (root, or a delegated cgroup v2 subtree), a run's group is
made below this process's own: under cgroup v2 with the memory and pids controllers (``memory.max``,
``memory.swap.max`` 0, ``pids.max``), else under the v1 memory and pids hierarchies (``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes`` where swap is accounted, ``pids.max``). The child joins its group before it executes
anything (``join``, from the sandbox's pre-exec hook), so every process it forks is counted and killed with it.
``available`` says whether groups can be made here, and why not.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from functools import lru_cache

from coati.distributed.reward.processes import kill_until_gone, process_states


def _own_paths() -> dict[str, str]:
    """{controller or "" for v2: this process's cgroup path} from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f.read().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _mounts() -> dict[str, str]:
    """{controller or "" for the v2 hierarchy: its mount point} from /proc/self/mountinfo."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f.read().splitlines():
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",") if len(fields) > sep + 3 else []
            if fstype == "cgroup2":
                mounts.setdefault("", fields[4])
            elif fstype == "cgroup":
                for c in ("memory", "pids"):
                    if c in options:
                        mounts.setdefault(c, fields[4])
    return mounts


@dataclass(frozen=True)
class Layout:
    """Where run groups are made: the parent folder per controller ("" for v2), and the cgroup version."""

    version: int
    parents: dict


@lru_cache(maxsize=1)
def layout() -> Layout | str:
    """Where this process can make run groups, or why it cannot (one line): a group is made, limited, joined by a
    child and removed once, so a host that refuses any step is found here, not at a run."""
    found = _find_layout()
    if not isinstance(found, Layout):
        return found
    try:
        _probe(found)
    except (OSError, subprocess.SubprocessError) as e:
        return f"a control group cannot be made, limited and joined here ({e})"
    return found


def _probe(found: Layout) -> None:
    group = RunGroup(64 << 20, 4, found)
    try:
        subprocess.run(["/bin/true"], preexec_fn=group.join, check=True, timeout=10)
    finally:
        if group.kill():
            raise OSError("the probe's group kept a process")


def _find_layout() -> Layout | str:
    try:
        own, mounts = _own_paths(), _mounts()
    except OSError as e:
        return f"cannot read this process's control groups ({e})"
    if "" in mounts and "" in own:
        parent = os.path.join(mounts[""], own[""].lstrip("/"))
        probe = os.path.join(parent, f"coati-probe-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(probe)
            try:
                with open(os.path.join(probe, "cgroup.controllers")) as f:
                    enabled = set(f.read().split())
            finally:
                os.rmdir(probe)
            if {"memory", "pids"} <= enabled:
                return Layout(2, {"": parent})
        except OSError:
            pass
    if "memory" in mounts and "pids" in mounts:
        parents = {c: os.path.join(mounts[c], own.get(c, "/").lstrip("/")) for c in ("memory", "pids")}
        if all(os.access(p, os.W_OK) for p in parents.values()):
            return Layout(1, parents)
    return (
        "no writable control group with the memory and pids controllers (needs root or a delegated cgroup v2 subtree)"
    )


def available() -> tuple[bool, str]:
    """(whether run groups can be made here, a one-line description: the version, or why not)."""
    got = layout()
    return (True, f"cgroup v{got.version}") if isinstance(got, Layout) else (False, got)


class RunGroup:
    """One run's control group: ``memory_bytes`` and ``processes`` for the whole run. Create, let the child ``join``
    before it executes, ``kill`` when the run ends (returns the processes left, 0 once it is gone)."""

    def __init__(self, memory_bytes: int, processes: int, where: Layout | None = None):
        got = where or layout()
        if not isinstance(got, Layout):
            raise RuntimeError(got)
        name = f"coati-run-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.version = got.version
        self.dirs = [os.path.join(parent, name) for parent in got.parents.values()]
        made = []
        try:
            for d in self.dirs:
                os.mkdir(d, 0o755)
                made.append(d)
            if self.version == 2:
                (d,) = self.dirs
                self._write(d, "memory.max", memory_bytes)
                self._write(d, "memory.swap.max", 0, optional=True)
                self._write(d, "pids.max", processes)
            else:
                memory, pids = self.dirs
                self._write(memory, "memory.limit_in_bytes", memory_bytes)
                self._write(memory, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                self._write(pids, "pids.max", processes)
        except OSError:
            for d in reversed(made):
                os.rmdir(d)
            raise
        self._procs = [os.path.join(d, "cgroup.procs") for d in self.dirs]

    @staticmethod
    def _write(folder: str, name: str, value, optional: bool = False) -> None:
        try:
            with open(os.path.join(folder, name), "w") as f:
                f.write(str(value))
        except FileNotFoundError:
            if not optional:
                raise

    def join(self, pid: int = 0) -> None:
        """Move process ``pid`` into the group: the calling one by default (then called in the child between fork and
        exec: no allocation-heavy work, no locks), or a child the parent holds at a gate before it executes."""
        for procs in self._procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)

    def members(self) -> list[int]:
        try:
            with open(self._procs[0]) as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def kill(self, timeout_s: float = 2.0) -> int:
        """Kill every process in the group until none is left (or ``timeout_s`` passes), reaping the zombies that
        are this process's children, then remove the group; returns how many were left."""
        kill_file = os.path.join(self.dirs[0], "cgroup.kill")
        if self.version == 2 and os.path.exists(kill_file) and self.members():
            self._write(self.dirs[0], "cgroup.kill", 1)
        left = kill_until_gone(lambda: [p[:3] for p in process_states(self.members())], timeout_s)
        if left:
            return left
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass
        return 0
