"""Helpers the tests share (fixtures live in the conftest files)."""

import time


def wait_until(condition, timeout_s: float, what: str, every_s: float = 0.05):
    """Poll ``condition()`` until it returns something true (returned) or ``timeout_s`` passes (an AssertionError
    naming ``what``): a deadline instead of a fixed sleep, so a test waits no longer than the event takes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


def tiny_families(root, archs, **shape) -> dict[str, str]:
    """A tiny model folder of each family in ``archs`` under ``root`` (``build_tiny_model`` with ``shape``), by
    family."""
    from coati.testing import build_tiny_model

    return {a: str(build_tiny_model(root / a, arch=a, **shape)) for a in archs}
