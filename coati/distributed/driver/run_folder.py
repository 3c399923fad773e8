"""Where a run writes, and that it is the run's own.

A command-line run (``run.save_dir`` and ``run.project``, no ``run.run_dir``) gets a fresh folder
``<save_dir>/<project>/<start time>``, and ``<save_dir>/<project>/latest`` points at the newest one (``choose_folder``,
``link_latest``); ``--resume`` and ``--overwrite`` take the run ``latest`` points at.

A run folder belongs to one run at a time. ``RunFolder.claim`` takes an exclusive lock (``<folder>/.lock``, held by
the driver process while the run lives), refuses a folder that holds another run's results unless the run resumes it or
is told to overwrite it, and checks, before any actor starts, that the folder is writable and its disk has room for the
checkpoints the run will keep. An overwritten run's results are deleted (``clear``) only once the new run has passed
every check that needs no actor, so a run refused for bad input loses nothing. On a cluster, ``check_shared`` makes sure
the consumers' nodes see the folder too (they write their checkpoint shards into it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from pathlib import Path

from coati.distributed.guards import RunError

RUN_FILES = ("checkpoints", "final", "metrics.jsonl", "summary.json", "evals.json", "samples.jsonl", "tensorboard")
"""what a run leaves in its folder; any of them marks the folder as holding a run"""

_HELD: dict[str, RunFolder] = {}

LATEST = "latest"
"""the link in a project folder to its newest run"""


def choose_folder(save_dir: str, project: str, resume: str | None, overwrite: bool, create: bool = True) -> str:
    """The run folder of a run in ``<save_dir>/<project>``: a resumed or overwritten run takes the project's newest
    (where ``latest`` points, or the project folder itself where it holds a run of its own; a resume from a checkpoint
    folder inside a run folder, that run folder); a new run a fresh folder named by its start time, made here (when
    ``create``) so that two runs starting in the same second get two."""
    project_dir = Path(os.path.abspath(save_dir)) / project  # absolute: actors write there from other folders
    if resume and resume != "latest" and Path(resume).resolve().parent.name == "checkpoints":
        return str(Path(resume).resolve().parent.parent)
    if resume or overwrite:
        latest = latest_run(project_dir)
        if latest is not None:
            return str(latest)
        if holds_run(project_dir):
            return str(project_dir)
        if resume:
            raise RunFolderError(
                f"--resume {resume}: {project_dir} holds no run to resume (no {LATEST} link); start a new run, or "
                "pass the run's folder with --run-dir"
            )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        candidate = project_dir / (stamp if n == 1 else f"{stamp}-{n}")
        if not create:
            if not candidate.exists():
                return str(candidate)
            continue
        try:
            candidate.mkdir(parents=True)
            return str(candidate)
        except FileExistsError:
            continue
        except OSError as e:
            raise RunFolderError(
                f"run folder {candidate} cannot be made ({e.strerror}); choose another --save-dir"
            ) from e
    raise RunFolderError(f"{project_dir} has 999 runs started at {stamp}; use another --project")


def resumed_folder(save_dir: str | None, project: str, run_dir: str | None, resume: str) -> tuple[str, str]:
    """(the run folder ``--resume`` continues, the checkpoint spec to resume from there): ``latest`` of the project,
    a run folder (its latest checkpoint) or a checkpoint folder inside a run folder."""
    if run_dir:
        return run_dir, resume
    path = Path(resume)
    if resume != "latest":
        if (path / "config.yaml").is_file() or holds_run(path):
            return str(path.resolve()), "latest"
        if path.resolve().parent.name == "checkpoints":
            return str(path.resolve().parent.parent), resume
    if save_dir is None:
        raise RunFolderError(f"--resume {resume}: the run writes nothing (no save_dir); pass its folder with --run-dir")
    return choose_folder(save_dir, project, "latest", False, create=False), resume


def link_latest(folder: str) -> None:
    """Point ``latest`` in the folder's parent (its project) at it, replacing the link at once."""
    path = Path(folder)
    link = path.parent / LATEST
    tmp = path.parent / f".{LATEST}-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(path.name)
    os.replace(tmp, link)


def run_files(folder: Path) -> list[str]:
    """The files of ``RUN_FILES`` a run left in ``folder``."""
    return [name for name in RUN_FILES if (Path(folder) / name).exists()]


def holds_run(folder: Path) -> bool:
    """Whether a run left its files in ``folder``."""
    return bool(run_files(folder))


def latest_run(project_dir: Path) -> Path | None:
    """The run folder ``<project_dir>/latest`` points at (None without the link); refused unless it is a folder of
    the project's own: a link planted to point elsewhere would have ``--overwrite`` delete, and ``--resume`` write,
    outside the project."""
    link = Path(project_dir) / LATEST
    if not link.is_symlink() and not link.exists():
        return None
    target = link.resolve()
    if target.parent != Path(project_dir).resolve() or not target.is_dir() or target.is_symlink():
        raise RunFolderError(
            f"{link} points at {target}, which is not a run folder inside {Path(project_dir).resolve()}; remove the "
            "link, or pass the run's folder with --run-dir"
        )
    return target


def run_of(folder: str) -> str:
    """A run folder given as itself or as its project folder (whose ``latest`` run it means)."""
    if holds_run(Path(folder)):
        return folder
    latest = latest_run(Path(folder))
    return folder if latest is None else str(latest)


class RunFolderError(ValueError):
    """The folder cannot be used by this run; the message says why and what to do."""


class RunFolder:
    def __init__(self, path: Path, lock_file):
        self.path, self._lock_file = path, lock_file
        self.claims = 1
        """claims by this process (a CLI run and the launch it makes); the lock goes with the last release"""

    @classmethod
    def claim(cls, path: str, mode: str) -> RunFolder:
        """Lock ``path`` for this process. ``mode``: 'new' (refused if another run's results are there), 'resume'
        (the folder's run continues) or 'overwrite' (its results stay until ``clear``). A folder this process already
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
            lock_file = open(folder / ".lock", "a+")  # held for the run's life
        except OSError as e:
            raise RunFolderError(
                f"run folder {folder} is not writable ({e.strerror}); choose another --save-dir"
            ) from e
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
        present = run_files(self.path)
        if mode == "new" and present:
            raise RunFolderError(
                f"run folder {self.path} holds another run ({', '.join(present)}); resume it (--resume latest), "
                "overwrite it (--overwrite), or use another --project/--save-dir"
            )

    def clear(self) -> None:
        """Delete the results of the run this folder held (an overwrite, once the new run has been checked)."""
        for name in RUN_FILES:
            target = self.path / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()

    def results_bytes(self) -> int:
        """Bytes of the results this folder holds (what ``clear`` frees)."""
        files = [self.path / name for name in RUN_FILES]
        files += [f for d in files if d.is_dir() for f in d.rglob("*")]
        return sum(f.stat().st_size for f in files if f.is_file())

    def check_space(self, needed_bytes: int, what: str, freed_bytes: int = 0) -> None:
        """Refuse when the disk lacks ``needed_bytes``, counting ``freed_bytes`` that the run will delete first."""
        free = shutil.disk_usage(self.path).free + freed_bytes
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


def check_shared(path: str, node_ids) -> None:
    """Consumers write their shards of every checkpoint (model, optimizer, RNG) into ``<run folder>/checkpoints`` on
    their own nodes, while the driver writes the rest and completes the checkpoint on its node: on other nodes the
    folder must be the same storage (a shared file system). Refuse before any actor starts if one of ``node_ids``
    does not see a file the driver has just written there."""
    import uuid

    import ray

    others = sorted(set(node_ids) - {ray.get_runtime_context().get_node_id()})
    if not others:
        return
    marker = Path(path) / f".visible-{uuid.uuid4().hex[:8]}"
    marker.write_text("")
    try:
        seen = visible_from(others, str(marker.resolve()))
    finally:
        marker.unlink()
    blind = [node for node, ok in seen.items() if not ok]
    if blind:
        raise RunFolderError(
            f"run folder {os.path.abspath(path)} is not shared with the consumers' node(s) {blind}: they write their "
            "checkpoint shards there and the driver completes each checkpoint on its own node. Put save_dir on "
            "storage every node mounts at the same path (NFS, a cluster file system), or run with save_dir None"
        )


def visible_from(node_ids, path: str) -> dict[str, bool]:
    """Whether ``path`` exists as seen from each node (a task pinned to it)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(os.path.exists)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(path)
        for node in node_ids
    ]
    return dict(zip(node_ids, ray.get(refs, timeout=120), strict=True))


def submitted_job_folder_error(path: str) -> str | None:
    """Why a relative run folder is refused inside a job started by ``ray job submit`` (None: fine). Such a job runs
    in Ray's temporary copy of its working directory, deleted with the Ray session, and a relative folder would
    vanish with it."""
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ or os.path.isabs(path):
        return None
    return (
        f"run folder {path!r} is relative, and this job runs in Ray's temporary working directory "
        f"({os.getcwd()}), which is deleted with the Ray session; pass an absolute --save-dir (or --run-dir), on "
        "storage every consumer node mounts"
    )


@contextlib.contextmanager
def writing(folder: Path, what: str):
    """Writes of ``what`` into the run folder ``folder``: a failed one (a full disk, a folder gone read-only) raises
    RunError naming the folder and the space left there, not a bare OSError."""
    try:
        yield
    except OSError as e:
        try:
            free = f"{shutil.disk_usage(folder).free / 2**20:.0f} MiB free there"
        except OSError:
            free = "its disk unreadable"
        raise RunError(
            f"writing {what} into {folder} failed ({e.strerror or e}; {free}); free some space or use another "
            "--save-dir, then resume (--resume latest)"
        ) from e
