"""Weight and object transport between consumers and producers over Ray collective groups.

Consumers push fresh weights to every producer after each update with ``ray_broadcast_tensor_dict``. Groups are Ray
collective groups (``ray.util.collective.init_collective_group``) on backends registered here, each owning a private
torch process group with its own TCPStore: ``COATI_GLOO`` for CPU tensors, ``COATI_NCCL`` for CUDA tensors. Unlike
Ray's built-in gloo backend, they never touch torch's default process group, so a ColossalAI consumer (which has its
own torch.distributed world) and a producer that belongs to several groups both work.

Wire format of one push (all collectives on the same group, rooted at ``src``):
1. a fixed header of 4 int64: version, schema id, byte length of an optional pickled schema, transfer count;
2. the pickled schema (keys, shapes, dtypes, transfer layout; see ``wire_layout.py``), only when it differs from the
   last push on this group;
3. one uint8 broadcast per transfer: a tensor of at least ``direct_bytes`` straight from its own storage (with the
   tensors that follow it back to back in that storage, when the sender holds its weights in flat buffers), or a
   bucket of smaller tensors packed back to back (16-byte aligned) up to ``bucket_bytes``.
Receivers may take large tensors straight into destination tensors (``into``: a model's parameters) and stream the
rest into a callback (``on_bucket``) instead of keeping the whole dict.
"""

from __future__ import annotations

import datetime
import pickle
import time
from collections import deque
from typing import Any, Callable

import ray
import ray.experimental.internal_kv as internal_kv
import ray.util.collective as cc
import torch
import torch.distributed as dist
from ray.util.collective.backend_registry import _global_registry, register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup

from coati.distributed.wire_layout import Schema, destination, pack_into, plan_transfers, schema_id, span_bytes, unpack

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_BUCKET_BYTES = 128 << 20
DEFAULT_DIRECT_BYTES = 1 << 20
_IN_FLIGHT = 8
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
        except Exception as e:  # noqa: BLE001 - re-raised with the group and rank named
            raise CollectiveError(
                f"{what} in group {self.group_name!r} failed on rank {self.rank}/{self.world_size}: {e}"
            ) from e
        if ok is False:
            raise CollectiveError(
                f"{what} in group {self.group_name!r} timed out after {self.timeout_s:.0f} s on rank "
                f"{self.rank}/{self.world_size}; a peer is dead or never joined"
            )

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
            self, world_size, rank, group_name, type(self).torch_backend,
            _group_timeouts.get(group_name, DEFAULT_TIMEOUT_S),
        )  # fmt: skip

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


def destroy_group(group_name: str) -> None:
    if cc.is_group_initialized(group_name):
        cc.destroy_collective_group(group_name)
    _group_timeouts.pop(group_name, None)
    _sent_schema.pop(group_name, None)
    _recv_schema.pop(group_name, None)
    for key in [k for k in _staging if k[0] == group_name]:
        del _staging[key]


# ---- objects ---------------------------------------------------------------------------------------------------


def ray_broadcast_object(
    obj: Any, src: int = 0, device=None, group_name: str = "default", group: TorchGroup | None = None
) -> Any:
    """Broadcast a picklable object from rank ``src``; every rank returns it."""
    g = _handle(group_name, group)
    device = g.device if isinstance(g, TorchGroup) else torch.device(device or "cpu")
    if g.rank == src:
        payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    else:
        size = torch.zeros(1, dtype=torch.int64, device=device)
    g.broadcast_tensor(size, src)
    if g.rank != src:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if payload.numel():
        g.broadcast_tensor(payload, src)
    if g.rank == src:
        return obj
    return pickle.loads(payload.cpu().numpy().tobytes())


# ---- tensor dicts ----------------------------------------------------------------------------------------------


_sent_schema: dict[str, tuple[int, Schema]] = {}
_recv_schema: dict[str, dict[int, Schema]] = {}


class VersionedDict(dict):
    """A received tensor dict with the ``version`` the sender attached to the push, and how the push travelled."""

    version: int = -1
    transfers: int = 0
    """collective calls that carried tensors"""
    nbytes: int = 0
    """bytes those calls carried"""
    direct_bytes: int = 0
    """of those, bytes sent straight from the sender's tensors (not packed into buckets)"""
    in_place_bytes: int = 0
    """of those, bytes received straight into ``into`` destinations (receivers only)"""


def ray_broadcast_tensor_dict(
    tensor_dict: dict[str, Any] | None,
    src: int = 0,
    device=None,
    group_name: str = "default",
    *,
    version: int = 0,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    direct_bytes: int = DEFAULT_DIRECT_BYTES,
    on_bucket: Callable[[dict[str, torch.Tensor]], None] | None = None,
    into: dict[str, torch.Tensor] | None = None,
    group: TorchGroup | None = None,
) -> VersionedDict:
    """Broadcast ``tensor_dict`` (on rank ``src``; ignored elsewhere) to every rank of ``group_name``.

    Tensors of any dtype and shape (0-dim and non-contiguous included) arrive bitwise equal; non-tensor values
    travel with the schema. Tensors of at least ``direct_bytes`` go straight from and into their storage, several
    in one transfer (of up to ``bucket_bytes``) when they lie back to back in one storage; smaller ones are packed
    into buckets of up to ``bucket_bytes``. On receivers:
    - ``into`` (optional) maps names to destination tensors (a model's parameters); a direct transfer whose
      destinations have the senders' shapes and dtypes and live contiguous on the wire device, laid out as on the
      sender, is received in place, no copy;
    - ``on_bucket`` (optional) is called with every other tensor as soon as its bucket lands, and the returned dict
      holds only the non-tensor values, so a backend can load weights without two full copies;
    - without either, the returned dict holds every tensor.
    The source returns its own dict (as a VersionedDict). ``group`` (a TorchGroup) replaces the Ray group name in
    processes that are not Ray actors. On coati's groups the wire device is the group's (CUDA for NCCL, host memory
    for gloo) and received tensors live there; ``device`` only matters for groups on Ray's own backends.
    """
    g = _handle(group_name, group)
    # The wire lives where the group's backend works (host memory for gloo); tensors are moved there and back.
    device = g.device if isinstance(g, TorchGroup) else torch.device(device or "cpu")
    group_name = g.group_name
    rank = g.rank
    header = torch.zeros(4, dtype=torch.int64, device=device)
    if rank == src:
        schema = plan_transfers(tensor_dict, bucket_bytes, direct_bytes)
        sid = schema_id(schema)
        last = _sent_schema.get(group_name)
        blob = b"" if last is not None and last[0] == sid else pickle.dumps(schema)
        header[:] = torch.tensor([version, sid, len(blob), len(schema.sizes)], device=device)
    g.broadcast_tensor(header, src)
    version, sid, blob_len, _ = (int(x) for x in header.tolist())
    if rank == src:
        if blob:
            _broadcast_bytes(g, blob, src, device)
            _sent_schema[group_name] = (sid, schema)
        result = VersionedDict(tensor_dict)
        _send(g, src, schema, tensor_dict, device)
    else:
        known = _recv_schema.setdefault(group_name, {})
        if blob_len:
            known.clear()
            known[sid] = pickle.loads(_broadcast_bytes(g, None, src, device, blob_len))
        if sid not in known:
            raise CollectiveError(
                f"group {group_name!r} rank {rank}: push {version} reuses schema {sid:x} this rank never received; "
                "every rank must take part in every push of a group"
            )
        schema = known[sid]
        result = VersionedDict(schema.extras)
        for tensors in _receive(g, src, schema, device, into or {}, on_bucket is not None, result):
            if on_bucket is not None:
                if tensors:
                    on_bucket(tensors)
            else:
                result.update(tensors)
        if on_bucket is None:
            for e in schema.entries:  # received in place: hand back the destination
                if e.key not in result:
                    result[e.key] = into[e.key]
            # Keep the sender's key order.
            order = {e.key: i for i, e in enumerate(schema.entries)}
            result = VersionedDict(sorted(result.items(), key=lambda kv: order.get(kv[0], -1)))
    result.version = version
    result.transfers, result.nbytes = len(schema.sizes), sum(schema.sizes)
    result.direct_bytes = sum(size for size, d in zip(schema.sizes, schema.direct, strict=True) if d)
    return result


_staging: dict[tuple[str, str], list[torch.Tensor]] = {}


def _staging_buffers(group_name: str, device, nbytes: int) -> list[torch.Tensor]:
    """Two reusable transfer-sized buffers per group and device: one is filled while the other is on the wire."""
    key = (group_name, str(device))
    bufs = _staging.get(key)
    if bufs is None or bufs[0].numel() < nbytes:
        bufs = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
        _staging[key] = bufs
    return bufs


def _send(g, src: int, schema: Schema, tensor_dict, device) -> None:
    """Direct tensors go from their own storage; buckets are packed into one of two staging buffers while earlier
    transfers are on the wire. Up to ``_IN_FLIGHT`` transfers are posted at once, so the fixed cost of each
    collective call overlaps the others' transfer."""
    groups = schema.transfer_entries()
    if not isinstance(g, TorchGroup):
        for t, entries in enumerate(groups):
            if schema.direct[t]:
                buf = span_bytes(entries, tensor_dict, schema.sizes[t], device)
            else:
                buf = torch.empty(schema.sizes[t], dtype=torch.uint8, device=device)
                pack_into(buf, entries, tensor_dict, device)
            g.broadcast_tensor(buf, src)
        return
    packed = [size for size, d in zip(schema.sizes, schema.direct, strict=True) if not d]
    bufs = _staging_buffers(g.group_name, device, max(packed)) if packed else []
    in_flight: deque = deque()  # (transfer, work, buffer kept alive until done, staging slot or None)
    free_slots = [0, 1]

    def retire():
        t, work, _, slot = in_flight.popleft()
        g.wait(work, f"broadcast of transfer {t} from rank {src}")
        if slot is not None:
            free_slots.append(slot)

    for t, entries in enumerate(groups):
        while len(in_flight) >= _IN_FLIGHT or (not schema.direct[t] and not free_slots):
            retire()
        slot = None
        if schema.direct[t]:
            buf = span_bytes(entries, tensor_dict, schema.sizes[t], device)
        else:
            slot = free_slots.pop(0)
            buf = bufs[slot][: schema.sizes[t]]
            pack_into(buf, entries, tensor_dict, device)
        in_flight.append((t, g.broadcast_async(buf, src), buf, slot))
    while in_flight:
        retire()


def _receive(g, src: int, schema: Schema, device, into: dict, reuse: bool, result: VersionedDict):
    """Yield each transfer's tensors as it lands (an empty dict when it went straight into ``into``; counted in
    ``result.in_place_bytes``). With ``reuse`` the tensors are views of one of two staging buffers, valid until the
    next one is requested; else each transfer gets its own storage. Up to ``_IN_FLIGHT`` receives are posted ahead."""
    groups = schema.transfer_entries()
    if not groups:
        return
    if not isinstance(g, TorchGroup):
        for t, entries in enumerate(groups):
            buf = torch.empty(schema.sizes[t], dtype=torch.uint8, device=device)
            g.broadcast_tensor(buf, src)
            yield unpack(entries, buf)
        return
    dests = [
        destination(entries, size, into, device) if d else None
        for entries, size, d in zip(groups, schema.sizes, schema.direct, strict=True)
    ]
    result.in_place_bytes = sum(size for size, dest in zip(schema.sizes, dests, strict=True) if dest is not None)
    bufs = _staging_buffers(g.group_name, device, max(schema.sizes)) if reuse else None
    free_slots = [0, 1]
    posted: deque = deque()  # (transfer, buffer, work, staging slot or None)
    nxt = 0
    for t in range(len(groups)):
        while nxt < len(groups) and len(posted) < _IN_FLIGHT:
            slot = None
            if dests[nxt] is not None:
                buf = dests[nxt]
            elif reuse:
                if not free_slots:
                    break
                slot = free_slots.pop(0)
                buf = bufs[slot][: schema.sizes[nxt]]
            else:
                buf = torch.empty(schema.sizes[nxt], dtype=torch.uint8, device=device)
            posted.append((nxt, buf, g.broadcast_async(buf, src), slot))
            nxt += 1
        _, buf, work, slot = posted.popleft()
        g.wait(work, f"broadcast of transfer {t} from rank {src}")
        yield {} if dests[t] is not None else unpack(groups[t], buf)
        if slot is not None:  # the caller is done with this bucket's views
            free_slots.append(slot)


def _broadcast_bytes(g, blob: bytes | None, src: int, device, length: int = 0) -> bytes:
    """Broadcast raw bytes whose length every rank already knows (from a header)."""
    if blob is not None:
        buf = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(length, dtype=torch.uint8, device=device)
    g.broadcast_tensor(buf, src)
    return blob if blob is not None else buf.cpu().numpy().tobytes()
