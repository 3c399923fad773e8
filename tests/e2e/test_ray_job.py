"""The documented cluster commands on a private Ray cluster of this machine: ``ray start --head``, ``ray status``,
``ray job submit --working-dir . -- coati train ...`` from a user's folder (their data and reward file there, not the
repository), ``ray job logs``, then the cluster stopped. The cluster
has ports and a temporary folder of its own, so it runs beside the suite's; it starts in a session of its own and is
stopped by killing that session's processes (``ray stop`` would stop every cluster of the machine). The submitted
driver joins the job's cluster without being told (no --address)."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from coati.distributed.runtime.placement import free_port
from coati.testing import build_tiny_model

PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--node-manager-port",
    "--object-manager-port",
    "--metrics-export-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
)


def free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z" and int(entry) != os.getpid():  # zombies are gone
                pids.append(int(entry))
    return pids


@pytest.mark.background
def test_a_submitted_job_joins_its_cluster_and_writes_its_run_folder(tmp_path):
    tiny = build_tiny_model(tmp_path / "model")
    user = tmp_path / "user"
    user.mkdir()
    (user / "job_reward.py").write_text(
        "def exact(completions, gt_answer, **kw):\n"
        "    return [float(c.strip() == g) for c, g in zip(completions, gt_answer)]\n"
    )
    data = user / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "gt_answer": str(2 * i)}) + "\n" for i in range(8)))
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    flags = [f for k, v in ports.items() for f in (k, str(v))]
    temp = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    # Its own session: every process the cluster starts can be found, and killed, by it.
    head = subprocess.run(
        [
            "setsid",
            "--wait",
            "ray",
            "start",
            "--head",
            *flags,
            "--temp-dir",
            temp,
            "--num-cpus",
            "4",
            "--include-dashboard",
            "true",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    sid = None
    try:
        assert head.returncode == 0, head.stderr[-2000:]
        gcs = f"127.0.0.1:{ports['--port']}"
        pids = [int(p) for p in subprocess.run(["pgrep", "-f", temp], capture_output=True, text=True).stdout.split()]
        sid = os.getsid(pids[0])
        deadline = time.monotonic() + 180  # the head reports its resources seconds after `ray start` returns
        while True:
            status = subprocess.run(
                ["ray", "status", "--address", gcs], capture_output=True, text=True, env=env, timeout=120
            )
            if status.returncode != 0 or "4.0 CPU" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status.returncode == 0 and "4.0 CPU" in status.stdout, status.stdout + status.stderr
        dashboard = f"http://127.0.0.1:{ports['--dashboard-port']}"
        job = subprocess.run(
            [
                "ray",
                "job",
                "submit",
                "--address",
                dashboard,
                "--working-dir",
                ".",
                "--submission-id",
                "coati-job",
                "--runtime-env-json",
                json.dumps({"env_vars": {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}}),
                "--",
                "coati",
                "train",
                "-rt",
                "job_reward:exact",
                "-d",
                "train.jsonl",
                "-m",
                str(tiny),
                "-b",
                "transformers",
                "--max-steps",
                "1",
                "-mnt",
                "8",
                "-tbs",
                "2",
                "-ibs",
                "2",
                "-imbs",
                "2",
                "-sd",
                str(tmp_path / "runs"),
                "-p",
                "job",
                "--no-progress",
                "--report-to",
                "jsonl",
            ],
            cwd=user,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
        assert "succeeded" in job.stdout, job.stdout[-2000:]
        logs = subprocess.run(
            ["ray", "job", "logs", "--address", dashboard, "coati-job"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert "1 steps in" in logs.stdout, logs.stdout[-2000:]
        run = tmp_path / "runs" / "job" / "latest"
        assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
        assert (run / "final" / "model.safetensors").is_file()
    finally:
        if sid is not None:
            for _ in range(50):
                alive = session_pids(sid)
                if not alive:
                    break
                for pid in alive:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            assert not session_pids(sid), "the private cluster's processes survived"
        shutil.rmtree(temp, ignore_errors=True)
