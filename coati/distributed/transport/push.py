"""Weight and object pushes over a collective group (``group.py``): consumers send fresh weights to every producer
after each update with ``ray_broadcast_tensor_dict``.

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

import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from coati.distributed.transport.group import CollectiveError, TorchGroup, _handle
from coati.distributed.transport.wire_layout import (
    Schema,
    destination,
    pack_into,
    plan_transfers,
    schema_id,
    span_bytes,
    unpack,
)

DEFAULT_BUCKET_BYTES = 128 << 20
DEFAULT_DIRECT_BYTES = 1 << 20
_IN_FLIGHT = 8

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
        schema = _known_schema(g, src, device, version, sid, blob_len)
        result = _receive_all(g, src, schema, device, into or {}, on_bucket)
    result.version = version
    result.transfers, result.nbytes = len(schema.sizes), sum(schema.sizes)
    result.direct_bytes = sum(size for size, d in zip(schema.sizes, schema.direct, strict=True) if d)
    return result


def _known_schema(g, src: int, device, version: int, sid: int, blob_len: int) -> Schema:
    """The push's schema on a receiver: the one broadcast with it, or the one last received under its id."""
    known = _recv_schema.setdefault(g.group_name, {})
    if blob_len:
        known.clear()
        known[sid] = pickle.loads(_broadcast_bytes(g, None, src, device, blob_len))
    if sid not in known:
        raise CollectiveError(
            f"group {g.group_name!r} rank {g.rank}: push {version} reuses schema {sid:x} this rank never received; "
            "every rank must take part in every push of a group"
        )
    return known[sid]


def _receive_all(g, src: int, schema: Schema, device, into: dict, on_bucket) -> VersionedDict:
    """A receiver's side of a push: every tensor into ``into``, to ``on_bucket`` or into the returned dict, which
    keeps the sender's key order."""
    result = VersionedDict(schema.extras)
    for tensors in _receive(g, src, schema, device, into, on_bucket is not None, result):
        if on_bucket is not None:
            if tensors:
                on_bucket(tensors)
        else:
            result.update(tensors)
    if on_bucket is None:
        for e in schema.entries:  # received in place: hand back the destination
            if e.key not in result:
                result[e.key] = into[e.key]
        # Keep the sender's key order, in the same dict (what ``_receive`` recorded on it stays).
        order = {e.key: i for i, e in enumerate(schema.entries)}
        ordered = sorted(result.items(), key=lambda kv: order.get(kv[0], -1))
        result.clear()
        result.update(ordered)
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
