"""A run folder belongs to one run at a time. ``RunFolder.claim`` takes an exclusive lock (``<folder>/.lock``, held
by the driver process while the run lives), refuses a folder that holds another run's results unless the run
resumes it or is told to overwrite it, and checks, before any actor starts, that the folder is writable and its
disk has room for the checkpoints the run will keep.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

RUN_FILES = ("checkpoints", "final", "metrics.jsonl", "summary.json", "evals.json", "samples.jsonl")
"""what a run leaves in its folder; any of them marks the folder as holding a run"""

_HELD: dict[str, "RunFolder"] = {}


class RunFolderError(ValueError):
    """The folder cannot be used by this run; the message says why and what to do."""


class RunFolder:
    def __init__(self, path: Path, lock_file):
        self.path, self._lock_file = path, lock_file
        self.claims = 1
        """claims by this process (a CLI run and the launch it makes); the lock goes with the last release"""

    @classmethod
    def claim(cls, path: str, mode: str) -> "RunFolder":
        """Lock ``path`` for this process. ``mode``: 'new' (refused if another run's results are there), 'resume'
        (the folder's run continues) or 'overwrite' (its results are deleted first). A folder this process already
        holds is claimed once more, as it is (the run that claimed it launches, or restarts, in it)."""
        if mode not in ("new", "resume", "overwrite"):
            raise ValueError(f"mode must be new, resume or overwrite, got {mode!r}")
        key = os.path.realpath(path)
        if key in _HELD:
            _HELD[key].claims += 1
            return _HELD[key]
        folder = Path(key)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock_file = open(folder / ".lock", "a+")  # noqa: SIM115 - held for the run's life
        except OSError as e:
            raise RunFolderError(f"run folder {folder} is not writable ({e.strerror}); choose another --save-dir") from e
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            owner = lock_file.read().strip() or "unknown"
            lock_file.close()
            raise RunFolderError(
                f"run folder {folder} is in use by another run (pid {owner}); wait for it to finish or use another "
                "--project/--save-dir"
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        held = cls(folder, lock_file)
        try:
            held._check_contents(mode)
        except BaseException:
            held.release()
            raise
        _HELD[key] = held
        return held

    def _check_contents(self, mode: str) -> None:
        present = [name for name in RUN_FILES if (self.path / name).exists()]
        if mode == "new" and present:
            raise RunFolderError(
                f"run folder {self.path} holds another run ({', '.join(present)}); resume it (--resume latest), "
                "overwrite it (--overwrite), or use another --project/--save-dir"
            )
        if mode == "overwrite":
            for name in present:
                target = self.path / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()

    def check_space(self, needed_bytes: int, what: str) -> None:
        free = shutil.disk_usage(self.path).free
        if free < needed_bytes:
            raise RunFolderError(
                f"run folder {self.path} has {free / 2**30:.2f} GiB free but {what} need about "
                f"{needed_bytes / 2**30:.2f} GiB; free some space, keep fewer checkpoints or use another --save-dir"
            )

    def release(self) -> None:
        self.claims -= 1
        if self.claims > 0:
            return
        _HELD.pop(str(self.path), None)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        finally:
            self._lock_file.close()


def model_bytes(path: str) -> int:
    """Bytes of a model folder's weight files (what one copy of its weights takes on disk)."""
    folder = Path(path)
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt") for f in folder.glob(pattern))
