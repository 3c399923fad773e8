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
