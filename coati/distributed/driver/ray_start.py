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
    if address:
        ray.init(address=address)
    elif os.environ.get(JOB_DRIVER_ENV) and os.environ.get("RAY_ADDRESS"):
        ray.init()  # the submitted job's cluster, with the job's runtime environment
    else:
        ray.init(address="local", include_dashboard=False, num_cpus=max(os.cpu_count() or 2, 4), log_to_driver=False)


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""an HTTP/2 client's connection preface and an empty SETTINGS frame: what a gRPC client (Ray's) opens with"""


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Refuse (ValueError: bad input, before any actor) within ``timeout_s`` unless a Ray cluster's gRPC server
    answers at a host:port address: nothing listening, or something else listening (``ray.init`` waited far longer,
    or forever)."""
    import socket

    if address == "auto" or "://" in address:
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
