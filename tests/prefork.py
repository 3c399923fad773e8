"""Ray workers forked from processes that have already imported the heavy modules (torch, transformers,
ColossalAI, vLLM), so an actor of the suite starts without importing them again (~10 s of a core each).

The session's Ray cluster starts every worker as ``python tests/prefork.py <default_worker.py> <args...>`` (Ray's
``py_executable``). That client hands its argument list, environment, working folder and standard streams to a
server (``serve``, one per environment, started by the session fixture with Ray) over a Unix socket; the server whose
environment is the worker's forks a child that takes them over and runs Ray's worker entry point as a fresh
interpreter would, and the client stays until the child ends, then ends with its status. The child is the worker Ray
registers (its own pid), so killing it, or the actor's ``os.getpid()``, kills the worker; a client killed outright
takes the child with it (the child watches a pipe the client holds).

A fork is a new process of the same interpreter state, so a worker whose environment differs from every server's in
anything read at import time (the malloc tunables, thread counts, the hub, the path, torch's, vLLM's or coati's
settings) would start wrong: the client then starts Python itself, as without a server, and so does any client that
cannot reach one. ``COATI_PREFORK_LOG`` names a file each client appends "forked" or "exec <reason>" to. Ray itself is
never imported by a server: its C++ settings (the job id among them) are read from the environment once, at import,
so a worker has to import it under its own environment.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import threading

SOCKET_ENV = "COATI_PREFORK_SOCKET"
LOG_ENV = "COATI_PREFORK_LOG"
CLIENT_ENV = "COATI_PREFORK_CLIENT"
"""set in a forked worker: the pid of its client, the process Ray started"""
SERVERS: list = []
"""the session's server processes, once ``start`` has run"""
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.auto.modeling_auto",
    "colossalai.booster",
    "colossalai.nn.optimizer",
    "vllm",
    # vLLM's top package imports the rest lazily: its CPU engine's modules (its entry point, vllm.entrypoints.llm,
    # imports Ray and is left to the worker)
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.worker.cpu_model_runner",
    "vllm.model_executor.models.llama",
    # what Ray's import brings in besides Ray (a worker then imports only Ray's own modules)
    "uvloop",
    "requests",
    "jsonschema",
    "msgpack",
    "psutil",
    "google.protobuf",
    "pdb",
    "tracemalloc",
    "faulthandler",
)
# read at import time by the preloaded modules or by the C libraries they load: a worker whose value differs is
# started by exec, never forked
SENSITIVE_PREFIXES = (
    "GLIBC_",
    "MALLOC_",
    "LD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH",
    "CUDA",
    "NVIDIA_",
    "VLLM_",
    "COATI_",
    "PYTORCH_",
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
)


AFTER_IMPORT = ("COATI_USER_FOLDERS",)
"""variables of those prefixes that nothing reads at import time (coati.registry reads its folders at the first
lookup): a worker may differ in them and still be forked"""


def _sensitive(env: dict) -> dict:
    return {
        k: v
        for k, v in env.items()
        if k.startswith(SENSITIVE_PREFIXES) and k not in (SOCKET_ENV, LOG_ENV) and k not in AFTER_IMPORT
    }


def _send(sock: socket.socket, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    socket.send_fds(sock, [struct.pack("!I", len(data)) + data], list(fds))


def _tell(conn: socket.socket, obj) -> None:
    """Send ``obj`` to a client that may have gone meanwhile (Ray stopping a worker's start): the server goes on."""
    try:
        _send(conn, obj)
    except OSError:
        pass


def _recv(sock: socket.socket, maxfds: int = 0):
    head, fds, _, _ = socket.recv_fds(sock, 4, maxfds)
    if len(head) < 4:
        return None, fds
    (n,) = struct.unpack("!I", head)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


# ---- server ----------------------------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import ``PRELOAD``, then fork a worker for each client until the parent process ends."""
    import importlib

    env = _sensitive(os.environ)
    before = dict(os.environ)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this machine lacks is imported by the worker itself
            pass
    if "ray" in sys.modules:
        sys.exit("prefork: a preloaded module imported ray, whose settings a forked worker would inherit")
    # what the imports set in the environment, as a fresh worker's imports would set it
    added = {k: v for k, v in os.environ.items() if k not in before}
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.2)
        if ready:
            conn, _ = listener.accept()
            pid = _fork_worker(conn, listener, children, env, added)
            if pid is None:
                conn.close()
            else:
                children[pid] = conn
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = children.pop(pid)
                _tell(conn, {"status": status})
                conn.close()


def _fork_worker(conn, listener, children, env, added) -> int | None:
    conn.settimeout(30)  # a client sends its request as it connects: one that does not is not waited for
    try:
        request, fds = _recv(conn, maxfds=4)
    except OSError:
        return None
    conn.settimeout(None)
    if request is None or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        return None
    if _sensitive(request["env"]) != env:
        keys = sorted(k for k in set(env) | set(_sensitive(request["env"])) if env.get(k) != request["env"].get(k))
        _tell(conn, {"exec": "environment differs: " + ",".join(keys)})
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in children.values():
            other.close()
        conn.close()
        _become_worker(request, fds, added)  # never returns
    for fd in fds:
        os.close(fd)
    _tell(conn, {"pid": pid})  # a client gone by now takes the child with it (the pipe it watches)
    return pid


def _become_worker(request: dict, fds: list[int], added: dict) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        watch = fds[3]
        threading.Thread(target=_die_with_client, args=(watch,), daemon=True).start()
        os.environ.clear()
        os.environ.update({**added, **request["env"], CLIENT_ENV: str(request["client"])})
        os.chdir(request["cwd"])
        argv = request["argv"]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import runpy

        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a worker's crash is printed and its status kept
        import traceback

        traceback.print_exc()
    finally:
        try:  # what the interpreter does on its way out: wait for threads, run the exit hooks, flush
            threading._shutdown()
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _die_with_client(fd: int) -> None:
    while os.read(fd, 1):
        pass
    os.kill(os.getpid(), signal.SIGKILL)


# ---- the session's side ----------------------------------------------------------------------------------------


def start(environments: list[dict[str, str]], folder: str) -> tuple[list, dict]:
    """Start a server for each of ``environments`` (the driver's environment plus these variables); returns the
    processes and the ``runtime_env`` entries that route the cluster's workers through them: a worker goes to the
    first whose environment is its own."""
    import subprocess

    global SERVERS
    paths = [os.path.join(folder, f"s{i}.sock") for i in range(len(environments))]
    SERVERS = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", path],
            env={**os.environ, **env_vars},
            stdout=subprocess.PIPE,
        )
        for path, env_vars in zip(paths, environments, strict=True)
    ]
    routing = {
        "py_executable": f"{sys.executable} {os.path.abspath(__file__)}",
        "env_vars": {SOCKET_ENV: os.pathsep.join(paths), LOG_ENV: os.path.join(folder, "workers.log")},
    }
    return SERVERS, routing


def wait_ready(server) -> bool:
    """Whether ``server`` has imported its modules and listens (False: it ended, and its workers start by exec)."""
    return server.stdout.readline().strip() == b"ready"


# ---- client ----------------------------------------------------------------------------------------------------


def _log(line: str) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _exec(argv: list[str], why: str) -> None:
    _log("exec " + why)
    os.execv(sys.executable, [sys.executable, *argv])


def _ask(path: str, argv: list[str]):
    """Ask the server at ``path`` to fork this worker: (socket, its reply), or (None, why not). A forked worker
    watches a pipe whose write end this process holds open until it ends."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        sock.close()
        return None, f"server unreachable ({e})"
    watch_r, watch_w = os.pipe()
    _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid()}, [0, 1, 2, watch_r])
    os.close(watch_r)
    reply, _ = _recv(sock)
    if reply is None or "exec" in reply:
        sock.close()
        os.close(watch_w)
        return None, (reply or {}).get("exec", "server closed")
    return sock, reply


def client(argv: list[str]) -> None:
    """Have the server fork this worker and wait for it; start Python itself when that is not possible."""
    sock, reply = None, "no server"
    for path in filter(None, os.environ.get(SOCKET_ENV, "").split(os.pathsep)):
        sock, reply = _ask(path, argv)
        if sock is not None:
            break
    if sock is None:
        _exec(argv, reply)
    child = reply["pid"]
    _log(f"forked {child} from {os.getpid()}")

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, forward)
    reply, _ = _recv(sock)
    status = (reply or {}).get("status")
    if status is None:  # the server is gone: the worker cannot be waited for, so it goes with this client
        os._exit(1)
    if os.WIFSIGNALED(status):  # ends as its worker did (SIGKILL and SIGSTOP keep their default, and cannot be set)
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        client(sys.argv[1:])
