"""The suite's forked Ray workers (``tests/prefork.py``) against what a worker started as a new interpreter gives:
the server's imports done, but the worker's own environment, folder, path, pid and random state; a worker whose
import-time environment differs started by exec; a forked worker killed outright reported dead by Ray, its client
gone with it; a client gone before its answer leaving the server serving."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from coati.distributed.driver.actor_group import cpu_actor_env
from coati.distributed.reward.processes import process_states
from tests import prefork
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.environ.get("COATI_PREFORK") == "0", reason="COATI_PREFORK=0: no server")


def _describe():
    import random
    import sys

    return {
        "pid": os.getpid(),
        "parent": os.getppid(),
        "preloaded": "transformers" in sys.modules,
        "job": os.environ.get("RAY_JOB_ID"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "path": list(sys.path),
        "draw": random.random(),
    }


def _actor(ray, env_vars=None, cpu_actor=True, **options):
    """A probe actor in a run's CPU actor environment (and ``env_vars``), or the session's own."""

    @ray.remote(num_cpus=0)
    class Probe:
        def describe(self):
            return _describe()

        def client(self):
            return int(os.environ.get(prefork.CLIENT_ENV, 0))

    env = {"runtime_env": {"env_vars": env_vars or {}}}
    return Probe.options(**(cpu_actor_env(env, 0) if cpu_actor else env), **options).remote()


def test_a_forked_worker_has_its_own_environment_pid_and_random_state_and_its_environment_s_server(ray_cluster):
    ray = ray_cluster
    actors = [_actor(ray) for _ in range(2)] + [_actor(ray, cpu_actor=False)]
    seen = ray.get([a.describe.remote() for a in actors])
    servers = [server.pid for server in prefork.SERVERS]
    # forked by the server in a run's CPU actor environment, the last by the one in the session's
    assert [s["parent"] for s in seen] == [servers[0], servers[0], servers[1]], (seen, servers)
    for s in seen:
        assert s["preloaded"]  # its imports already done
        assert s["job"] and s["omp"] == "1"  # the environment Ray gave this worker
        # on the path as in a new interpreter running Ray's worker script: its folder, not the server's
        assert any(p.endswith(os.path.join("ray", "_private", "workers")) for p in s["path"]), s["path"]
        assert os.path.dirname(prefork.__file__) not in s["path"], s["path"]
    assert len({s["pid"] for s in seen}) == 3
    assert len({s["draw"] for s in seen}) == 3  # random state not shared through the fork
    for a in actors:
        ray.kill(a)


def test_a_worker_whose_import_time_environment_differs_starts_as_a_new_interpreter(ray_cluster):
    ray = ray_cluster
    actor = _actor(ray, {"OMP_NUM_THREADS": "2"})
    s = ray.get(actor.describe.remote())
    assert s["parent"] not in [server.pid for server in prefork.SERVERS] and not s["preloaded"]
    assert s["omp"] == "2"
    ray.kill(actor)


def test_a_forked_worker_killed_outright_is_reported_dead_and_its_client_ends(ray_cluster):
    ray = ray_cluster
    actor = _actor(ray, max_restarts=0)
    s = ray.get(actor.describe.remote())
    client = ray.get(actor.client.remote())
    assert s["parent"] == prefork.SERVERS[0].pid
    # the client: the process Ray started, waiting on the server for its worker
    with open(f"/proc/{client}/cmdline", "rb") as f:
        assert b"prefork.py" in f.read()
    os.kill(s["pid"], signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.describe.remote(), timeout=60)
    wait_until(lambda: all(state == "Z" for _, _, state, _ in process_states([client])), 30, "the client's end")


def test_a_client_gone_before_its_reply_leaves_the_server_forking(ray_cluster):
    ray = ray_cluster
    server = prefork.SERVERS[0]
    for _ in range(3):  # asks to be forked in an environment the server refuses, and goes before the answer
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.args[-1])
        read, write = os.pipe()
        prefork._send(sock, {"argv": ["-"], "env": {"OMP_NUM_THREADS": "9"}, "cwd": "/", "client": 0}, [0, 1, 2, read])
        sock.close()
        os.close(read)
        os.close(write)
    actor = _actor(ray)
    assert ray.get(actor.describe.remote())["parent"] == server.pid
    assert server.poll() is None
    ray.kill(actor)


def test_a_client_ends_by_the_signal_that_ended_its_worker(ray_cluster, tmp_path):
    """A forked worker killed by a signal its client cannot catch (SIGKILL: Ray's own kill) ends the client by it,
    as an exec'd worker would end, without a traceback."""
    server = prefork.SERVERS[1]  # the session's environment, read back from the server's own
    with open(f"/proc/{server.pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    env = {k.decode(): v.decode() for k, v in env.items()}
    env.update({prefork.SOCKET_ENV: server.args[-1], prefork.LOG_ENV: str(tmp_path / "log")})
    script = tmp_path / "worker.py"
    for signum in (signal.SIGKILL, signal.SIGTERM):
        script.write_text(f"import os\nos.kill(os.getpid(), {int(signum)})\n")
        out = subprocess.run(
            [sys.executable, prefork.__file__, str(script)], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == -signum and "Traceback" not in out.stderr, (signum, out.returncode, out.stderr)
    log = (tmp_path / "log").read_text().splitlines()
    assert len(log) == 2 and all(line.startswith("forked ") for line in log), log  # forked, not started by exec


@pytest.mark.parametrize(
    "context",
    [
        {},
        {
            "env_vars": {"A": "x ${HOME} ${COATI_UNSET_X} $HOME", "B": "plain"},
            "py_executable": "/usr/bin/python3 /path with/prefork.py",
            "command_prefix": ["cd", "/tmp", "&&"],
            "override_worker_entrypoint": "/other/entry.py",
        },
    ],
)
def test_the_setup_step_execs_what_ray_s_own_would(context, monkeypatch):
    """``tests/ray_setup.py`` (the session cluster's setup step, without Ray's import) sets the same variables and
    execs the same command as Ray's ``RuntimeEnvContext.exec_worker`` for the arguments Ray passes."""
    from ray._private.runtime_env.context import RuntimeEnvContext
    from ray.core.generated.common_pb2 import Language

    from tests import ray_setup

    args = ["/ray/default_worker.py", "--node-ip-address=1.2.3.4", "--arg=it's $HOME", "-S"]
    argv = [*args[:2], f"--serialized-runtime-env-context={json.dumps(context)}", *args[2:], "--language=PYTHON"]
    runs = []
    for run in ("ray", "ours"):
        before = dict(os.environ)
        execs = []
        monkeypatch.setattr(os, "execvp", lambda file, args, execs=execs: execs.append((file, list(args))))
        if run == "ray":
            RuntimeEnvContext.deserialize(json.dumps(context)).exec_worker(list(args), Language.Value("PYTHON"))
        else:
            ray_setup.setup(list(argv))
        changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
        os.environ.clear()
        os.environ.update(before)
        runs.append((execs, changed))
    assert runs[0] == runs[1] and len(runs[0][0]) == 1
    assert ray_setup.command(["/ray/default_worker.py", "--language=JAVA"]) is None  # Ray's own script's work
