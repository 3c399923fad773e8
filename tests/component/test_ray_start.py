"""A local cluster started as a run starts it (``start_ray`` without an address), in a process of its own: its
session folders sit under a folder only the user can enter, and its token is readable by the user alone."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROBE = """
import json, os, ray
from coati.distributed.driver.ray_start import start_ray
start_ray(None)
session = ray._private.worker._global_node.get_session_dir_path()
print(json.dumps({"session": session, "token": os.environ["RAY_AUTH_TOKEN_PATH"]}))
ray.shutdown()
"""


@pytest.mark.background
def test_a_local_cluster_keeps_its_folder_and_token_to_its_user():
    root = tempfile.mkdtemp(prefix="cr-", dir="/tmp")  # short: Ray's socket paths live under it
    home = tempfile.mkdtemp(prefix="crh-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(COATI_RAY_ROOT=root, HOME=home, HF_HUB_OFFLINE="1")
        proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert Path(out["session"]).is_relative_to(root)
        assert os.stat(root).st_mode & 0o777 == 0o700  # Ray's 0777 folders below it cannot be reached by others
        assert out["token"] == os.path.join(root, "auth_token") and os.stat(out["token"]).st_mode & 0o777 == 0o600
        assert not Path(home, ".ray", "auth_token").exists()  # Ray's default token file (0644) was not written
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


EARLY = """
import json, sys, threading, ray
from coati import cli
from coati.distributed.driver import preflight
seen = {}
def slow_check(reward):  # the last of the checks after the files: Ray starts beside them
    seen["starting"] = any(t.name == "coati-ray-start" and t.is_alive() for t in threading.enumerate())
    raise ValueError("refused by the last check")
preflight.check_sandbox = slow_check
starts = []
try:
    cli.train(sys.argv[1:], "coati train", starts)
except ValueError as e:
    seen["error"] = str(e)
seen["starts"] = len(starts)
starts[0].wait()
seen["up"] = ray.is_initialized()
seen["session"] = ray._private.worker._global_node.get_session_dir_path()
starts[0].stop()
seen["after_stop"] = ray.is_initialized()
print(json.dumps(seen))
"""


def run_with_a_late_refusal(script: str, tmp_path: Path, root: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh process, given a tiny model's command line whose local cluster lives under ``root``."""
    from coati.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    (tmp_path / "data.jsonl").write_text("".join(f'{{"prompt": "q{i}", "gt_answer": "1"}}\n' for i in range(8)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(COATI_RAY_ROOT=root, HF_HUB_OFFLINE="1")
    args = ["-m", str(model), "-b", "transformers", "-d", str(tmp_path / "data.jsonl"), "-sd", str(tmp_path)]
    return subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )


@pytest.mark.background
def test_a_local_cluster_starts_while_the_slower_checks_run_and_a_refusal_stops_it(tmp_path):
    """Once the input files are checked, the local cluster starts on a thread of its own beside the tokenizer's and
    data's checks; a run refused by a later check hands it back, and stopping it shuts the cluster down."""
    root = tempfile.mkdtemp(prefix="cr-", dir="/tmp")
    try:
        proc = run_with_a_late_refusal(EARLY, tmp_path, root)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["error"] == "refused by the last check" and seen["starting"] and seen["starts"] == 1
        assert seen["up"] and Path(seen["session"]).is_relative_to(root) and not seen["after_stop"]
        assert "SIGTERM handler is not set" not in proc.stderr and "Started a local Ray" not in proc.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


REFUSED = """
import sys
from coati import cli
from coati.distributed.driver import preflight
def refuse(reward):
    raise ValueError("refused by the last check")
preflight.check_sandbox = refuse
sys.exit(cli.train_cli(sys.argv[1:]))
"""


@pytest.mark.background
def test_a_refusal_while_the_cluster_starts_prints_one_line_and_leaves_no_process(tmp_path):
    """The command line refused by a check after the files, with its local cluster still starting: the error is the
    one line printed, and once the command has exited no process of that cluster is left (they end with it)."""
    from tests.helpers import wait_until

    root = tempfile.mkdtemp(prefix="cr-", dir="/tmp")
    try:
        proc = run_with_a_late_refusal(REFUSED, tmp_path, root)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines() == ["coati train: error: refused by the last check"], proc.stderr
        assert Path(root, "ray").is_dir()  # the cluster had begun to start

        def left() -> str:
            return subprocess.run(["pgrep", "-af", root], capture_output=True, text=True).stdout

        wait_until(lambda: not left(), timeout_s=20, what="the refused run's cluster processes ending")
    finally:
        shutil.rmtree(root, ignore_errors=True)
