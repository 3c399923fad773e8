"""The cluster a run starts or joins is the user's own: its folder and token private, ``--address auto`` taken only
from the user's own address file and listening process (attacks another local user could make otherwise)."""

import os
import socket
import subprocess
import sys
import time

import pytest

from coati.distributed.driver import ray_start
from coati.distributed.driver.ray_start import listener_uids, own_cluster_address, private_root, private_token

OTHER_UID = 54321
as_root = pytest.mark.skipif(os.getuid() != 0, reason="planting another user's files needs root")


def test_the_private_root_is_made_0700_and_narrowed(tmp_path, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setenv(ray_start.ROOT_ENV, str(root))
    assert private_root() == str(root) and root.stat().st_mode & 0o777 == 0o700
    root.chmod(0o777)
    private_root()
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_planted_root_is_refused(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv(ray_start.ROOT_ENV, str(tmp_path / "root"))
    with pytest.raises(ValueError, match="is not a folder of its own"):
        private_root()


@as_root
def test_a_root_of_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    os.chown(root, OTHER_UID, OTHER_UID)
    monkeypatch.setenv(ray_start.ROOT_ENV, str(root))
    with pytest.raises(ValueError, match=f"belongs to uid {OTHER_UID}, not to you"):
        private_root()


def test_the_token_is_readable_by_its_user_only(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    private_token(str(tmp_path))
    token = tmp_path / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    assert os.environ["RAY_AUTH_MODE"] == "token" and os.environ["RAY_AUTH_TOKEN_PATH"] == str(token)
    before = token.read_text()
    token.chmod(0o644)
    private_token(str(tmp_path))  # a later run keeps the token, narrowed
    assert token.read_text() == before and token.stat().st_mode & 0o777 == 0o600


def _address_file(tmp_path, monkeypatch, address: str):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir(exist_ok=True)
    path = tmp_path / "ray" / "ray_current_cluster"
    path.write_text(address)
    return path


def test_auto_without_a_cluster_of_ours_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(ValueError, match="no Ray cluster of yours is running here"):
        own_cluster_address()


def test_auto_joins_an_address_of_ours(tmp_path, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        _address_file(tmp_path, monkeypatch, f"127.0.0.1:{port}")
        assert listener_uids(port) == {os.getuid()}
        assert own_cluster_address() == f"127.0.0.1:{port}"


@as_root
def test_auto_refuses_an_address_file_another_user_planted(tmp_path, monkeypatch):
    path = _address_file(tmp_path, monkeypatch, "127.0.0.1:6379")
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(ValueError, match=f"belongs to uid {OTHER_UID}, not to you"):
        own_cluster_address()


@as_root
def test_auto_refuses_an_address_where_another_user_listens(tmp_path, monkeypatch):
    listener = (
        f"import os, socket, time; os.setgid({OTHER_UID}); os.setuid({OTHER_UID}); s = socket.socket(); "
        "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", listener], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 5
        while listener_uids(port) != {OTHER_UID} and time.monotonic() < deadline:
            time.sleep(0.05)
        _address_file(tmp_path, monkeypatch, f"127.0.0.1:{port}")
        with pytest.raises(ValueError, match=rf"where uid \[{OTHER_UID}\] listens, not a cluster of yours"):
            own_cluster_address()
    finally:
        proc.kill()
        proc.wait()
