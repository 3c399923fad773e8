"""Starting or joining the Ray cluster a run's actors go to; it imports Ray alone, so the command line can start the
cluster while the driver's modules (torch, transformers, ColossalAI) import."""

from __future__ import annotations

import os

JOB_DRIVER_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""set by Ray's job supervisor in the environment of a submitted job's driver (``ray job submit``), beside
RAY_ADDRESS, the job's cluster"""


def start_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (``check_inputs`` has checked that it answers); with None, the cluster of
    the Ray job this process is the driver of (``ray job submit``), else a local cluster of the job's own, whatever
    RAY_ADDRESS or clusters started with `ray start` exist on the machine (unless this process already has one)."""
    import ray

    if ray.is_initialized():  # this process's cluster (the command line starts it while the driver imports)
        return
    if address == "auto":
        address = own_cluster_address()
    if address:
        ray.init(address=address)
    elif submitted_job():
        ray.init()  # the submitted job's cluster, with the job's runtime environment
    else:
        init_local(local_root())


def submitted_job() -> bool:
    """Whether this process is a submitted Ray job's driver (``ray job submit``): its cluster is the job's."""
    return bool(os.environ.get(JOB_DRIVER_ENV) and os.environ.get("RAY_ADDRESS"))


def local_root() -> str:
    """The private folder a local cluster lives under, with its token set up (``private_root``, ``private_token``)."""
    root = private_root()
    private_token(root)
    return root


def init_local(root: str) -> None:
    """A local cluster of this job's own under ``root`` (Ray's own start-up lines left out: coati says its phases)."""
    import logging

    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        num_cpus=max(os.cpu_count() or 2, 4),
        log_to_driver=False,
        logging_level=logging.WARNING,
        _temp_dir=os.path.join(root, "ray"),
    )


def local_cluster(address: str | None) -> bool:
    """Whether ``start_ray(address)`` starts a local cluster (no address, not a submitted job's driver)."""
    import ray

    return not address and not submitted_job() and not ray.is_initialized()


class EarlyStart:
    """A local cluster started on a thread of its own while the caller goes on (the command line checks the model,
    tokenizer and data meanwhile: seconds of one core, where Ray's start mostly waits for its processes).

    The thread stays alive until the cluster is stopped: the kernel ends the processes Ray starts with the thread
    that started them (Ray sets their parent-death signal), so a thread that returned would take the cluster with
    it. ``wait`` raises what the start raised; ``stop`` waits for the start to end and shuts the cluster down, or,
    told not to wait (at exit, and after a refusal the command line has printed), shuts down a cluster that is up
    and leaves one still starting to end with the process: its processes get the parent-death signal then."""

    def __init__(self):
        import atexit
        import signal
        import sys
        import threading

        root = local_root()  # on this thread: the token's variables are set before any other thread reads them
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init sets on this thread
        self.error: BaseException | None = None
        self.up, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(root,), name="coati-ray-start", daemon=True)
        self.thread.start()
        atexit.register(self.stop, wait=False)

    def _hold(self, root: str) -> None:
        import logging

        quiet = _NotMainThread()
        logging.getLogger("ray._private.worker").addFilter(quiet)  # its SIGTERM handler: set above, on the main one
        try:
            init_local(root)
        except BaseException as e:  # noqa: BLE001 (handed to the waiting thread)
            self.error = e
        finally:
            logging.getLogger("ray._private.worker").removeFilter(quiet)
            self.up.set()
        self.release.wait()

    def wait(self) -> None:
        self.up.wait()
        if self.error is not None:
            raise self.error

    def stop(self, wait: bool = True) -> None:
        import ray

        if wait:
            self.up.wait()
        elif not self.up.is_set():
            return  # still starting: the process's exit ends it (the thread is held, so not before)
        if self.error is None and ray.is_initialized():
            ray.shutdown()
        self.release.set()


class _NotMainThread:
    """Leaves out Ray's warning that a driver started off the main thread sets no SIGTERM handler."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


ROOT_ENV = "COATI_RAY_ROOT"
"""a folder of the user's own for the local cluster's session folders, sockets and token (default
``<tmp>/coati-<uid>``)"""


def private_root() -> str:
    """The local cluster's root folder, made 0700 and checked to be the user's own (not a link, not another user's):
    Ray makes its session folders 0777 without the sticky bit, so only a private folder above them keeps other local
    users from renaming its sockets or reading its logs."""
    import tempfile

    root = os.environ.get(ROOT_ENV) or os.path.join(tempfile.gettempdir(), f"coati-{os.getuid()}")
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(root)
    fix = f"remove it, or set {ROOT_ENV} to a folder of yours"
    if not os.path.isdir(root) or os.path.islink(root):
        raise ValueError(f"Ray's private folder {root} is not a folder of its own (a link or a file); {fix}")
    if info.st_uid != os.getuid():
        raise ValueError(f"Ray's private folder {root} belongs to uid {info.st_uid}, not to you; {fix}")
    if info.st_mode & 0o077:
        os.chmod(root, 0o700)
    return root


def private_token(root: str) -> None:
    """Token authentication for the local cluster with a token only the user can read (``<root>/auth_token``, 0600;
    Ray's default ``~/.ray/auth_token`` is written 0644, and whoever reads it owns the cluster). A mode the user set
    (``RAY_AUTH_MODE`` other than token, ``RAY_AUTH_TOKEN``) is kept; a token file the user names
    (``RAY_AUTH_TOKEN_PATH``) is used, narrowed to 0600."""
    import secrets

    if os.environ.get("RAY_AUTH_MODE", "token") != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return  # the user's own choice: no token, or a token of theirs
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(root, "auth_token")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        if os.path.islink(path) or os.lstat(path).st_uid != os.getuid():
            raise ValueError(f"{path} is not a token file of yours; remove it") from None
        os.chmod(path, 0o600)
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    import sys

    if "ray" in sys.modules:  # Ray read its settings and token at import: read again (as ray.init does for its own)
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def own_cluster_address() -> str:
    """What ``--address auto`` joins: ``RAY_ADDRESS`` when set (the user's own environment), else the address in
    Ray's address file, taken only when that file and the process listening at the address are the user's own.
    Ray's own "auto" follows a file or a process any local user can plant (``/tmp/ray`` is 0777), and would send it
    the token."""
    import tempfile

    if os.environ.get("RAY_ADDRESS") and os.environ["RAY_ADDRESS"] != "auto":
        return os.environ["RAY_ADDRESS"]
    path = os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray", "ray_current_cluster")
    fix = "pass the head's address (--address HOST:PORT) instead of auto"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ValueError(f"--address auto: no Ray cluster of yours is running here (no {path}); {fix}") from None
    if os.path.islink(path) or info.st_uid != os.getuid():
        raise ValueError(f"--address auto: {path} belongs to uid {info.st_uid}, not to you; {fix}")
    with open(path) as f:
        address = f.read().strip()
    host, _, port = address.rpartition(":")
    owners = listener_uids(int(port)) if port.isdigit() else set()
    if owners != {os.getuid()}:
        who = f"uid {sorted(owners)}" if owners else "nothing"
        raise ValueError(f"--address auto: {path} names {address}, where {who} listens, not a cluster of yours; {fix}")
    return address


def listener_uids(port: int) -> set[int]:
    """The owners (uids) of the TCP sockets listening on ``port`` on this machine (``/proc/net/tcp`` and ``tcp6``)."""
    uids = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                uids.add(int(fields[7]))
    return uids


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""an HTTP/2 client's connection preface and an empty SETTINGS frame: what a gRPC client (Ray's) opens with"""


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse (ValueError: bad input, before any actor) within ``timeout_s`` unless a Ray cluster's gRPC server
    answers at a host:port address: nothing listening, or something else listening (``ray.init`` waited far longer,
    or forever)."""
    import socket

    if address == "auto":
        address = own_cluster_address()
    if "://" in address:
        return
    host, _, port = address.rpartition(":")
    fix = "start one with `ray start --head` on that node, or leave --address out to start a local one"
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(HTTP2_PREFACE)
            frame = conn.recv(9)
    except (OSError, ValueError) as e:
        raise ValueError(f"--address {address}: no Ray cluster answers there ({e}); {fix}") from None
    if len(frame) < 9 or frame[3] != 4:  # a gRPC server answers with its own SETTINGS frame (type 4)
        raise ValueError(
            f"--address {address}: something that is not a Ray cluster listens there (no gRPC reply); {fix}"
        )
