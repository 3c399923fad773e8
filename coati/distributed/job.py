"""A whole job as the command line runs it: Ray (joining ``run.address`` or starting a local cluster), the run folder,
the reporter (progress bar, plots, the loggers of ``run.report_to``), then ``launch``. Returns the run's summary."""

from __future__ import annotations

import dataclasses
import os

from coati.distributed.run_config import Config


def run_job(config: Config) -> dict:
    import ray

    from coati.distributed.launch import launch
    from coati.distributed.reporting import Reporter
    from coati.distributed.run_folder import RunFolder

    r = config.run
    if r.folder is None:
        raise ValueError("a job writes its outputs to <save_dir>/<project>: set save_dir (or run_dir)")
    from coati.distributed.run_folder import submitted_job_folder_error

    problem = submitted_job_folder_error(r.folder)
    if problem:
        raise ValueError(problem)
    # Claimed before anything writes there (the reporter appends metrics); launch claims the same folder again.
    folder = RunFolder.claim(r.folder, "resume" if r.resume else "overwrite" if r.overwrite else "new")
    try:
        if r.address:
            check_address(r.address)
            ray.init(address=r.address)
        elif not ray.is_initialized():
            ray.init(include_dashboard=False, num_cpus=max(os.cpu_count() or 2, 4), log_to_driver=False)
        reporter = Reporter(r.folder, report_to=r.report_to, project=r.project, config=dataclasses.asdict(config),
                            progress=r.progress, append=bool(r.resume))  # fmt: skip
        result = launch(config, on_step=reporter.on_step)
        return reporter.finish(result)
    finally:
        folder.release()


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Fail within ``timeout_s`` when nothing listens at a host:port Ray address (ray.init would wait far longer)."""
    import socket

    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        raise SystemExit(
            f"--address {address}: no Ray cluster answers there ({e}); start one with `ray start --head` on that "
            "node, or leave --address out to start a local one"
        ) from None
