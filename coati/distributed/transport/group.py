"""Collective groups between consumers and producers (and inference-engine workers), on Ray.

Groups are Ray collective groups (``ray.util.collective.init_collective_group``) on backends registered here, each
owning a private torch process group with its own TCPStore: ``COATI_GLOO`` for CPU tensors, ``COATI_NCCL`` for CUDA
tensors. Unlike Ray's built-in gloo backend, they never touch torch's default process group, so a ColossalAI consumer
(which has its own torch.distributed world) and a producer that belongs to several groups both work. Processes outside
Ray's actors (vLLM's workers) join with ``TorchGroup(..., address=group_address(name))``. What travels over a group
is ``push.py``'s business.
"""

from __future__ import annotations

import datetime
import time

import ray
import ray.experimental.internal_kv as internal_kv
import ray.util.collective as cc
import torch
import torch.distributed as dist
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup

from coati.distributed.runtime.liveness import note_progress

DEFAULT_TIMEOUT_S = 300.0
_group_timeouts: dict[str, float] = {}


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names the group, the rank and the cause."""


def _kv_key(group_name: str) -> str:
    return f"coati/collective/{group_name}"


def _node_address() -> str:
    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    import socket

    return socket.gethostbyname(socket.gethostname())


class TorchGroup:
    """A private torch process group (gloo or NCCL) with its own TCPStore; never torch's default group.

    Rank 0 binds the store on its node's address (not 127.0.0.1, so other nodes can reach it) on a free port and,
    when connected to Ray, publishes ``host:port`` in Ray's KV store. Other ranks take ``address`` when given (for
    processes outside Ray, such as inference-engine workers) or wait for it in the KV store.
    """

    def __init__(
        self,
        world_size: int,
        rank: int,
        group_name: str,
        backend: str = "gloo",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        address: str | None = None,
    ):
        self._world_size, self._rank, self._group_name = world_size, rank, group_name
        self.torch_backend = backend
        self.timeout_s = float(timeout_s)
        timeout = datetime.timedelta(seconds=self.timeout_s)
        if rank == 0:
            host = _node_address()
            # wait_for_workers=False: the address must be published before the peers can come.
            self._store = dist.TCPStore(host, 0, world_size, True, timeout=timeout, wait_for_workers=False)
            self.address = f"{host}:{self._store.port}"
            if ray.is_initialized():
                internal_kv._internal_kv_put(_kv_key(group_name), self.address, overwrite=True)
        else:
            self.address = address or self._wait_for_address()
            host, port = self.address.rsplit(":", 1)
            self._store = dist.TCPStore(host, int(port), world_size, False, timeout=timeout)
        store = dist.PrefixStore(f"coati/{group_name}", self._store)
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self._pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
            self.device = torch.device("cpu")

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def group_name(self) -> str:
        return self._group_name

    def _wait_for_address(self) -> str:
        key = _kv_key(self.group_name)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            value = internal_kv._internal_kv_get(key)
            if value is not None:
                return value.decode()
            time.sleep(0.02)
        raise CollectiveError(
            f"group {self.group_name!r} rank {self.rank}: rank 0 did not publish its address within "
            f"{self.timeout_s:.0f} s; is rank 0 alive and did it join with the same group name?"
        )

    def wait(self, work, what: str = "collective") -> None:
        """Finish ``work`` within the group's timeout, or raise CollectiveError naming the group and rank."""
        try:
            ok = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except Exception as e:  # re-raised with the group and rank named
            raise CollectiveError(
                f"{what} in group {self.group_name!r} failed on rank {self.rank}/{self.world_size}: {e}"
            ) from e
        if ok is False:
            raise CollectiveError(
                f"{what} in group {self.group_name!r} timed out after {self.timeout_s:.0f} s on rank "
                f"{self.rank}/{self.world_size}; a peer is dead or never joined"
            )
        note_progress()

    def broadcast_async(self, tensor: torch.Tensor, root: int):
        """Start a broadcast and return its work handle; finish it with ``wait``."""
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        return self._pg.broadcast([tensor], opts)

    def broadcast_tensor(self, tensor: torch.Tensor, root: int) -> None:
        self.wait(self.broadcast_async(tensor, root), f"broadcast from rank {root}")

    def destroy(self) -> None:
        if self.rank == 0 and ray.is_initialized():
            internal_kv._internal_kv_del(_kv_key(self.group_name))
        self._pg = None
        self._store = None


class _IsolatedTorchGroup(TorchGroup, BaseGroup):
    """A TorchGroup registered as a Ray collective backend (``ray.util.collective`` API)."""

    torch_backend = "gloo"

    def __init__(self, world_size: int, rank: int, group_name: str):
        TorchGroup.__init__(
            self,
            world_size,
            rank,
            group_name,
            type(self).torch_backend,
            _group_timeouts.get(group_name, DEFAULT_TIMEOUT_S),
        )

    @classmethod
    def backend(cls):
        return cls.__name__

    @classmethod
    def check_backend_availability(cls) -> bool:
        return dist.is_available()

    def destroy_group(self):
        self.destroy()

    def broadcast(self, tensors, broadcast_options=None):
        self.broadcast_tensor(tensors[0], broadcast_options.root_rank)

    def allreduce(self, tensors, allreduce_options=None):
        self.wait(self._pg.allreduce(tensors), "allreduce")

    def allgather(self, tensor_lists, tensors, allgather_options=None):
        self.wait(self._pg.allgather(tensor_lists, tensors), "allgather")

    def barrier(self, barrier_options=None):
        self.wait(self._pg.allreduce([torch.zeros(1, device=self.device)]), "barrier")

    def reduce(self, *args, **kwargs):
        raise NotImplementedError("reduce is not used by coati")

    def reducescatter(self, *args, **kwargs):
        raise NotImplementedError("reducescatter is not used by coati")

    def send(self, *args, **kwargs):
        raise NotImplementedError("send is not used by coati")

    def recv(self, *args, **kwargs):
        raise NotImplementedError("recv is not used by coati")


class COATI_GLOO(_IsolatedTorchGroup):
    """CPU tensors over a private gloo process group."""


class COATI_NCCL(_IsolatedTorchGroup):
    """CUDA tensors over a private NCCL process group (GPU-to-GPU, no host copy)."""

    torch_backend = "nccl"

    @classmethod
    def check_backend_availability(cls) -> bool:
        return dist.is_nccl_available() and torch.cuda.is_available()


class _RayGroup:
    """Adapter for groups on Ray's own backends: the same calls, synchronous."""

    def __init__(self, group_name: str):
        self.group_name = group_name
        self.rank = cc.get_rank(group_name)

    def broadcast_tensor(self, tensor, root):
        cc.broadcast(tensor, root, self.group_name)


def _handle(group_name: str, group: TorchGroup | None):
    if group is not None:
        return group
    g = cc.collective.get_group_handle(group_name)
    return g if isinstance(g, TorchGroup) else _RayGroup(group_name)


def register_backends() -> None:
    """Register COATI_GLOO and COATI_NCCL with Ray in this process (idempotent; every process must call it)."""
    for cls in (COATI_GLOO, COATI_NCCL):
        if not _global_registry.is_registered(cls.__name__):
            register_collective_backend(cls.__name__, cls)


def init_group(
    world_size: int, rank: int, group_name: str, backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Join the collective group ``group_name`` from inside an actor: ``"nccl"`` (CUDA tensors, GPU to GPU; every
    member on its own GPU) or ``"gloo"`` (through host memory). Every member must pass the same backend.

    ``timeout_s`` bounds the rendezvous and every collective on the group.
    """
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight group backend must be 'gloo' or 'nccl', got {backend!r}")
    register_backends()
    _group_timeouts[group_name] = float(timeout_s)
    cc.init_collective_group(world_size, rank, backend=f"COATI_{backend.upper()}", group_name=group_name)


def group_address(group_name: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """``host:port`` of a group's rank 0, for members outside Ray (``TorchGroup(..., address=...)``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = internal_kv._internal_kv_get(_kv_key(group_name))
        if value is not None:
            return value.decode()
        time.sleep(0.02)
    raise CollectiveError(f"group {group_name!r}: no address published within {timeout_s:.0f} s")


def forget_group_address(group_name: str) -> None:
    """Drop the address published under ``group_name``. Rank 0 publishes it and members look it up by name, so one
    left by an earlier group of the same name (a rank 0 killed before ``destroy``) would send members to a dead store;
    whoever names the group calls this before any member joins."""
    internal_kv._internal_kv_del(_kv_key(group_name))
