"""How a push lays tensors out on the wire: which tensors travel straight from memory (alone, or as spans of tensors
back to back in one storage) and which are packed into buckets, at which byte offsets, and the views that turn
received bytes back into tensors; plus ``flatten_parameters``, which lays a module's weights out so that a push is a
few spans, and ``cast_for_wire``, which lays a push's casts out the same way. Pure torch, no process groups: the
transport (``comm/push.py``) sends what this module plans.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import pickle
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 16
"""byte alignment of each tensor inside a bucket"""
FLAT_ALIGN = 64
"""byte alignment of each parameter in a flat buffer: that of torch's CPU allocator, so kernels see the alignment
they would see without flattening"""


@dataclass(frozen=True)
class Entry:
    """One tensor of a push: where its bytes sit (transfer index, byte offset in it) and how to view them."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    transfer: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Schema:
    """The layout of a push, sent once per group while it is unchanged."""

    entries: tuple[Entry, ...]
    sizes: tuple[int, ...]
    """bytes of each transfer (one broadcast each)"""
    direct: tuple[bool, ...]
    """per transfer: sent as it lies in the sender's memory (one tensor, or a span of tensors back to back in one
    storage), else a bucket of small tensors packed back to back"""
    extras: Any
    """non-tensor values of the dict, sent with the schema"""

    def transfer_entries(self) -> list[list[Entry]]:
        out = [[] for _ in self.sizes]
        for e in self.entries:
            out[e.transfer].append(e)
        return out


def plan_transfers(tensor_dict: dict[str, Any], bucket_bytes: int, direct_bytes: int) -> Schema:
    """Tensors of ``direct_bytes`` or more travel straight from their storage (no copy on either side when they are
    contiguous on the wire device), alone or as a span: tensors of any size lying back to back in one storage (a
    flat parameter buffer, see ``flatten_parameters``) go as one transfer of up to ``bucket_bytes``. Other small
    tensors are packed into buckets of up to ``bucket_bytes``."""
    entries, sizes, direct = [], [], []
    open_bucket, used = None, 0
    last_direct = None  # the tensor that ends the open span (always the last transfer)
    # Group by dtype so each bucket mostly holds one dtype, in a deterministic order.
    items = [(k, v) for k, v in tensor_dict.items() if isinstance(v, torch.Tensor)]
    items.sort(key=lambda kv: str(kv[1].dtype))
    for i, (key, t) in enumerate(items):
        nbytes = t.numel() * t.element_size()
        if nbytes and last_direct is not None and _follows(last_direct, t) and sizes[-1] + nbytes <= bucket_bytes:
            # Whatever its size, a tensor right after the open span in memory extends it: no copy, no extra call.
            entries.append(Entry(key, tuple(t.shape), t.dtype, len(sizes) - 1, sizes[-1], nbytes))
            sizes[-1] += nbytes
            last_direct = t
            continue
        in_run = (i + 1 < len(items) and _follows(t, items[i + 1][1])) or (i > 0 and _follows(items[i - 1][1], t))
        if nbytes and (nbytes >= direct_bytes or in_run):
            entries.append(Entry(key, tuple(t.shape), t.dtype, len(sizes), 0, nbytes))
            sizes.append(nbytes)
            direct.append(True)
            last_direct = t
            continue
        start = _round_up(used, ALIGN)
        if open_bucket is None or start + nbytes > bucket_bytes:
            open_bucket, start = len(sizes), 0
            sizes.append(0)
            direct.append(False)
            last_direct = None
        entries.append(Entry(key, tuple(t.shape), t.dtype, open_bucket, start, nbytes))
        used = sizes[open_bucket] = start + nbytes
    extras = {k: v for k, v in tensor_dict.items() if not isinstance(v, torch.Tensor)}
    return Schema(tuple(entries), tuple(sizes), tuple(direct), extras)


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def _follows(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` starts exactly where ``a`` ends, both contiguous in one storage."""
    return (
        a.is_contiguous()
        and b.is_contiguous()
        and a.device == b.device
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.data_ptr() + a.numel() * a.element_size() == b.data_ptr()
    )


def _region(first: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``nbytes`` of ``first``'s storage as flat uint8, starting where ``first`` starts (no copy)."""
    storage = first.untyped_storage()
    out = torch.empty(0, dtype=torch.uint8, device=first.device)
    return out.set_(storage, first.storage_offset() * first.element_size(), (nbytes,))


def span_bytes(entries: list[Entry], tensor_dict, nbytes: int, device) -> torch.Tensor:
    """A direct transfer's bytes on the wire device: its tensor's (or span's) own storage when it lives there, else
    one copy."""
    first = tensor_dict[entries[0].key].detach()
    if len(entries) == 1:
        return wire_bytes(first, device)
    return _region(first, nbytes).to(device)


def schema_id(schema: Schema) -> int:
    buf = io.BytesIO()
    pickle.dump(schema, buf)
    return int.from_bytes(hashlib.blake2b(buf.getvalue(), digest_size=7).digest(), "little")


def pack_into(buf: torch.Tensor, entries: list[Entry], tensor_dict, device) -> None:
    for e in entries:
        if e.nbytes:
            flat = tensor_dict[e.key].detach().reshape(-1).to(device)
            buf[e.offset : e.offset + e.nbytes].copy_(flat.view(torch.uint8))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage viewed as flat uint8 (no copy)."""
    return t.detach().reshape(-1).view(torch.uint8)


def wire_bytes(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` as flat bytes on the wire device: its own storage when contiguous there, else one copy."""
    t = t.detach()
    if t.device != device or not t.is_contiguous():
        t = t.to(device).contiguous()
    return as_bytes(t)


def unpack(entries: list[Entry], buf: torch.Tensor) -> dict[str, torch.Tensor]:
    return {e.key: buf[e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in entries}


def destination(entries: list[Entry], nbytes: int, into: dict, device) -> torch.Tensor | None:
    """Where a direct transfer can be received in place: the destination tensors of its entries as flat bytes, when
    each has the entry's shape and dtype, is contiguous on the wire device, and (for a span) they lie in one storage
    at the same relative offsets as on the sender; else None (received into a buffer and handed on)."""
    dests = []
    for e in entries:
        dest = into.get(e.key)
        if dest is None:
            return None
        dest = dest.data if isinstance(dest, torch.nn.Parameter) else dest
        ok = dest.dtype == e.dtype and tuple(dest.shape) == e.shape and dest.device == device
        if not (ok and dest.is_contiguous()):
            return None
        dests.append(dest)
    first = dests[0]
    for e, dest in zip(entries, dests, strict=True):
        same_storage = dest.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not same_storage or dest.data_ptr() - first.data_ptr() != e.offset:
            return None
    return _region(first, nbytes)


FLAT_CHUNK = 256 << 20
"""bytes a flat buffer holds at most (a larger tensor gets one of its own)"""


def flat_chunks(tensors: Iterable[torch.Tensor], dtype: torch.dtype, device, chunk_bytes: int = FLAT_CHUNK):
    """Copies of ``tensors`` (cast to ``dtype``) laid back to back in flat buffers on ``device``, in order, each
    buffer holding up to ``chunk_bytes``, every tensor ``FLAT_ALIGN``-byte aligned: yields each buffer's views as it
    is filled. ``tensors`` is read lazily, so a caller that drops the originals as it goes peaks at one buffer above
    them."""
    chunk, used = [], 0
    for t in itertools.chain(tensors, [None]):
        nbytes = 0 if t is None else _round_up(t.numel() * dtype.itemsize, FLAT_ALIGN)
        if chunk and (t is None or used + nbytes > chunk_bytes):
            buf, views, offset = torch.empty(used, dtype=torch.uint8, device=device), [], 0
            for q in chunk:
                n = q.numel() * dtype.itemsize
                views.append(buf[offset : offset + n].view(dtype).view(q.shape))
                views[-1].copy_(q)
                offset += _round_up(n, FLAT_ALIGN)
            yield views
            chunk, used = [], 0
        if t is not None:
            chunk.append(t)
            used += nbytes


@torch.no_grad()
def flatten_parameters(module: torch.nn.Module, chunk_bytes: int = FLAT_CHUNK) -> int:
    """Move ``module``'s parameters into flat buffers (``flat_chunks``), in ``named_parameters`` order, one run per
    (device, dtype). Returns the number of buffers.

    The Parameter objects stay the same (only ``.data`` moves), so optimizers and hooks holding them are unaffected;
    the old storages are freed as each buffer is filled, so the peak is one chunk above the model. Two models
    flattened alike (a consumer's and a producer's) push their weights in a few large transfers, received in place.
    Anything that later gives a parameter new storage (``module.to``) undoes it for that parameter; pushes stay
    correct, only slower, until this is called again.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
    for _, p in module.named_parameters():
        groups.setdefault((p.device, p.dtype), []).append(p)
    count = 0
    for (device, dtype), params in groups.items():
        moved = iter(params)
        for views in flat_chunks((p.data for p in params), dtype, device, chunk_bytes):
            for view in views:
                next(moved).data = view
            count += 1
    return count


@torch.no_grad()
def cast_for_wire(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor of another dtype replaced by its cast to ``dtype`` (None: ``state`` as it
    is). The casts lie in flat buffers as ``flatten_parameters`` lays out a module's weights of that dtype, so a push
    of a model's weights cast this way lands in place in an engine that holds them flattened in ``dtype``."""
    keys = [k for k, v in state.items() if dtype is not None and v.is_floating_point() and v.dtype != dtype]
    if not keys:
        return state
    devices = {state[k].device for k in keys}
    assert len(devices) == 1, f"tensors to cast lie on several devices: {devices}"
    cast = [view for views in flat_chunks((state[k] for k in keys), dtype, devices.pop()) for view in views]
    return {**state, **dict(zip(keys, cast, strict=True))}


@contextmanager
@torch.no_grad()
def separate_storages(module: torch.nn.Module):
    """Within the block, each parameter of ``module`` has storage of its own (a copy); after it, the parameters are
    back in their flat buffers with any values written meanwhile. For savers that write tensors as they are:
    ``torch.save`` writes a view's whole storage, so a checkpoint shard of flattened weights would hold every flat
    buffer it touches."""
    params = [p for _, p in module.named_parameters()]
    homes = [p.data for p in params]
    for p in params:
        p.data = p.data.clone()
    try:
        yield
    finally:
        for p, home in zip(params, homes, strict=True):
            home.copy_(p.data)
            p.data = home
