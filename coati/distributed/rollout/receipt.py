"""What a producer reports of one push it received (``PushReceipt``): the version it now holds, the fingerprints of
what its engine computes with (for the driver's attestation), and how the push travelled and loaded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PushReceipt:
    """One push, added up over the weight groups it came in (one per consumer pipeline stage)."""

    version: int
    fingerprints: dict | None = None
    """what the engine holds, sampled; None: the engine cannot tell"""
    transfers: int = 0
    """collective calls"""
    nbytes: int = 0
    direct_bytes: int = 0
    """bytes sent straight from the consumer's weights (not packed)"""
    in_place_bytes: int = 0
    """bytes that went straight into the engine's weights (no staging copy)"""
    receive_s: float = 0.0
    paused_s: float = 0.0
    """seconds generation stood still for the push (an engine that loads pushes while it generates)"""
    attest_s: float = 0.0
    load_threads: int = 0
    """the most threads a stage loaded with"""

    def add(self, got: dict, first: bool) -> None:
        """A stage's receipt as the backend returned it (``first``: the push's first stage)."""
        held = got.get("fingerprints")
        if first:
            self.fingerprints = held
        elif held is None or self.fingerprints is None:
            self.fingerprints = None
        else:
            self.fingerprints = {**self.fingerprints, **held}
        self.version = got["version"]
        for name in ("transfers", "nbytes", "direct_bytes", "in_place_bytes", "receive_s", "paused_s", "attest_s"):
            setattr(self, name, getattr(self, name) + got.get(name, 0))
        self.load_threads = max(self.load_threads, got.get("load_threads", 0))

    def report(self) -> dict:
        """The version, the fingerprints and the push's metrics (weights/*), those the engine measured."""
        out = {"version": self.version, "fingerprints": self.fingerprints, "weights/attest_s": self.attest_s}
        if self.receive_s:  # an engine that times its pushes: how long, and how long generation stood still
            out.update(
                {
                    "weights/receive_s": self.receive_s,
                    "weights/paused_s": self.paused_s,
                    "weights/load_threads": self.load_threads,
                }
            )
        if self.nbytes:
            out.update(
                {
                    "weights/transfers": self.transfers,
                    "weights/bytes": self.nbytes,
                    "weights/direct_fraction": self.direct_bytes / self.nbytes,
                    "weights/in_place_fraction": self.in_place_bytes / self.nbytes,
                }
            )
        return out
