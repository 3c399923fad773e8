"""The chaos benchmark's victims are the processes of the cluster its own job started, never another run's actors
that merely carry the same titles."""

import subprocess
import sys
import time

import psutil

from benchmarks.chaos import victims

SPAWN = (
    "import subprocess, sys, time\n"
    "subprocess.Popen(['bash', '-c', 'exec -a ray::GRPOConsumer sleep 60'])\n"
    "subprocess.Popen(['bash', '-c', 'exec -a ray::Producer sleep 60'])\n"
    "time.sleep(60)\n"
)


def _titled(pids: list[int]) -> bool:
    return all(psutil.Process(p).cmdline()[0].startswith("ray::") for p in pids)


def test_only_the_job_s_own_actors_are_victims():
    other = subprocess.Popen(["bash", "-c", "exec -a ray::GRPOConsumer sleep 60"])  # another run's consumer
    job = subprocess.Popen([sys.executable, "-c", SPAWN])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = victims(job.pid)
            if found["consumer"] and found["producer"] and _titled(found["consumer"] + found["producer"]):
                break
            time.sleep(0.05)
        assert other.pid not in found["consumer"] and len(found["consumer"]) == 1, found
        assert len(found["producer"]) == 1 and found["driver"] == [job.pid]
        assert psutil.Process(found["consumer"][0]).parent().pid == job.pid
    finally:
        for p in psutil.Process(job.pid).children(recursive=True) + [psutil.Process(job.pid)]:
            p.kill()
        other.kill()
        job.wait()
        other.wait()
