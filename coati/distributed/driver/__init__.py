"""The driver, which runs a job: read ``job.py`` (a run as the command line makes it) and ``launch.py`` (validate,
place, connect, push, loop) first, then ``preflight.py`` (the checks and the plan), ``actor_group.py`` (the actors),
``loop.py`` with ``rollouts.py`` and ``rollout_buffer.py`` (produce, consume, push), and the run's records:
``checkpoint.py``, ``run_folder.py``, ``eval_cache.py``, ``reporting.py``."""
