"""How a push lays tensors out on the wire: which tensors travel alone and which are packed into buckets, at which
byte offsets, and the views that turn received bytes back into tensors. Pure torch, no process groups: the transport
(``comm.py``) sends what this module plans.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 16
"""byte alignment of each tensor inside a bucket"""


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
    """per transfer: one tensor sent as it is (no packing), else a bucket of small tensors packed back to back"""
    extras: Any
    """non-tensor values of the dict, sent with the schema"""

    def transfer_entries(self) -> list[list[Entry]]:
        out = [[] for _ in self.sizes]
        for e in self.entries:
            out[e.transfer].append(e)
        return out


def plan_transfers(tensor_dict: dict[str, Any], bucket_bytes: int, direct_bytes: int) -> Schema:
    """Tensors of ``direct_bytes`` or more travel alone, straight from their storage (no copy on either side when
    they are contiguous on the wire device); smaller ones are packed into buckets of up to ``bucket_bytes``."""
    entries, sizes, direct = [], [], []
    open_bucket, used = None, 0
    # Group by dtype so each bucket mostly holds one dtype, in a deterministic order.
    items = [(k, v) for k, v in tensor_dict.items() if isinstance(v, torch.Tensor)]
    items.sort(key=lambda kv: str(kv[1].dtype))
    for key, t in items:
        nbytes = t.numel() * t.element_size()
        if nbytes and nbytes >= direct_bytes:
            entries.append(Entry(key, tuple(t.shape), t.dtype, len(sizes), 0, nbytes))
            sizes.append(nbytes)
            direct.append(True)
            continue
        start = -(-used // ALIGN) * ALIGN
        if open_bucket is None or start + nbytes > bucket_bytes:
            open_bucket, start = len(sizes), 0
            sizes.append(0)
            direct.append(False)
        entries.append(Entry(key, tuple(t.shape), t.dtype, open_bucket, start, nbytes))
        used = sizes[open_bucket] = start + nbytes
    extras = {k: v for k, v in tensor_dict.items() if not isinstance(v, torch.Tensor)}
    return Schema(tuple(entries), tuple(sizes), tuple(direct), extras)


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


def destination(entry: Entry, into: dict, device) -> torch.Tensor | None:
    dest = into.get(entry.key)
    if dest is None:
        return None
    dest = dest.data if isinstance(dest, torch.nn.Parameter) else dest
    ok = dest.dtype == entry.dtype and tuple(dest.shape) == entry.shape and dest.device == device
    return dest if ok and dest.is_contiguous() else None
