"""--max-restarts (run.max_restarts, applied by ``launch`` for every caller): after a RunError the run restarts from
the last checkpoint, at most N times. (One launch attempt is replaced by a recorder here; resuming itself is tested
end to end in tests/e2e.)"""

from pathlib import Path

import pytest

import coati.distributed.driver.launch as launch
import rl_example
from coati.distributed.driver.actor_group import RunError


def fake_launcher(fail_times, checkpoint_from=1):
    """A launch that fails ``fail_times`` times; attempts from the ``checkpoint_from``-th on write a checkpoint
    before they fail."""
    calls = []

    def launch_once(config, on_step, inputs):
        calls.append(config.run.resume)
        if len(calls) >= checkpoint_from:
            step = Path(config.run.folder) / "checkpoints" / "step-2"
            step.mkdir(parents=True, exist_ok=True)
            (step / "meta.json").write_text('{"step": 2}')
        if len(calls) <= fail_times:
            raise RunError("step 3: actor x-consumer-0 died\nlast checkpoint: runs/p/checkpoints/step-2")
        return {"history": [], "evals": [], "final_model": None}

    return launch_once, calls


def test_restarts_resume_from_latest(monkeypatch, tmp_path, no_ray):
    fake, calls = fake_launcher(fail_times=2)
    monkeypatch.setattr(launch, "_launch_once", fake)
    summary = rl_example.main(["-m", str(tmp_path), "-sd", str(tmp_path), "--no-progress", "--max-restarts", "2"])
    assert calls == [None, "latest", "latest"]
    # Each failure that caused a restart is kept in the summary (and summary.json), not only in the log.
    assert [why.splitlines()[0] for why in summary["restarts"]] == ["step 3: actor x-consumer-0 died"] * 2


def test_gives_up_after_max_restarts(monkeypatch, tmp_path, no_ray):
    fake, calls = fake_launcher(fail_times=5)
    monkeypatch.setattr(launch, "_launch_once", fake)
    with pytest.raises(RunError, match="x-consumer-0 died"):
        rl_example.main(["-m", str(tmp_path), "-sd", str(tmp_path), "--no-progress", "--max-restarts", "1"])
    assert calls == [None, "latest"]


def test_a_failure_before_the_first_checkpoint_restarts_from_the_start(monkeypatch, tmp_path, no_ray):
    """The first attempt fails before writing a checkpoint: the second begins as the first did (a resume would find
    no checkpoint and refuse); it writes one before failing, and the third resumes from it."""
    fake, calls = fake_launcher(fail_times=2, checkpoint_from=2)
    monkeypatch.setattr(launch, "_launch_once", fake)
    rl_example.main(["-m", str(tmp_path), "-sd", str(tmp_path), "--no-progress", "--max-restarts", "2"])
    assert calls == [None, None, "latest"]
