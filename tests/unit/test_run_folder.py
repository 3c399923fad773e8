"""Run folders of a project: each command-line run writes a fresh folder ``<save_dir>/<project>/<start time>``,
``latest`` points at the newest, and ``--resume``/``--overwrite`` take the run it points at."""

import os

import pytest

import coati.distributed.driver.launch as launch
import rl_example
from coati.cli import read_run
from coati.distributed.driver.run_folder import RunFolderError, choose_folder, link_latest, run_of


def test_a_new_run_gets_a_fresh_folder_even_in_the_same_second(tmp_path):
    first = choose_folder(str(tmp_path), "p", None, False)
    second = choose_folder(str(tmp_path), "p", None, False)
    assert first != second and os.path.dirname(first) == os.path.dirname(second) == str(tmp_path / "p")
    assert os.path.isdir(first) and os.path.isdir(second)
    planned = choose_folder(str(tmp_path), "p", None, False, create=False)  # a dry run names it without making it
    assert not os.path.exists(planned)


def test_resume_and_overwrite_take_the_latest_run(tmp_path):
    with pytest.raises(RunFolderError, match="holds no run to resume"):
        choose_folder(str(tmp_path), "p", "latest", False)
    old, new = choose_folder(str(tmp_path), "p", None, False), choose_folder(str(tmp_path), "p", None, False)
    link_latest(old)
    link_latest(new)  # replaced, not refused
    assert choose_folder(str(tmp_path), "p", "latest", False) == new
    assert choose_folder(str(tmp_path), "p", None, True) == new
    checkpoint = os.path.join(old, "checkpoints", "step-2")
    os.makedirs(checkpoint)
    assert choose_folder(str(tmp_path), "p", checkpoint, False) == old  # a checkpoint continues in its own run
    assert run_of(str(tmp_path / "p")) == new and run_of(old) == old


def test_a_project_folder_written_as_one_run_is_resumed_in_place(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "metrics.jsonl").write_text('{"step": 1}\n')
    assert choose_folder(str(tmp_path), "p", "latest", False) == str(tmp_path / "p")
    assert run_of(str(tmp_path / "p")) == str(tmp_path / "p")


def test_a_second_command_line_run_in_the_same_project_is_not_refused(monkeypatch, tmp_path, no_ray):
    """The same command twice: two run folders, each describing its own run, and ``latest`` at the second; the
    config.yaml each keeps starts a new run (it names no run folder)."""

    def one_step(config, on_step, inputs):
        on_step({"step": 1, "loss": 0.5})
        return {"history": [], "evals": [], "final_model": None}

    monkeypatch.setattr(launch, "_launch_once", one_step)
    argv = ["-m", str(tmp_path), "-sd", str(tmp_path / "runs"), "--no-progress"]
    first = rl_example.main(argv)["run_folder"]
    second = rl_example.main(argv)["run_folder"]
    assert first != second
    assert os.path.realpath(tmp_path / "runs" / "coati" / "latest") == second
    for folder in (first, second):
        assert os.path.isfile(os.path.join(folder, "summary.json"))
        assert "run_dir: null" in open(os.path.join(folder, "config.yaml")).read()
    assert read_run(str(tmp_path / "runs" / "coati"))["path"] == second
    assert rl_example.main([*argv, "--resume", "latest", "--max-steps", "3"])["run_folder"] == second


def test_a_latest_link_pointing_outside_the_project_is_refused(tmp_path):
    """A ``latest`` planted to point elsewhere would have ``--overwrite`` delete, and ``--resume`` write, there."""
    victim = tmp_path / "victim"
    (victim / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "p").mkdir(parents=True)
    (tmp_path / "runs" / "p" / "latest").symlink_to(victim)
    for resume, overwrite in (("latest", False), (None, True)):
        with pytest.raises(RunFolderError, match="which is not a run folder inside"):
            choose_folder(str(tmp_path / "runs"), "p", resume, overwrite)
    with pytest.raises(RunFolderError, match="which is not a run folder inside"):
        run_of(str(tmp_path / "runs" / "p"))
    assert (victim / "checkpoints").is_dir()


@pytest.mark.parametrize("project", ["../../x", "a/b", "..", ".", ""])
def test_a_project_that_is_a_path_is_refused(project):
    from coati.distributed.config.tree import RunConfig

    with pytest.raises(ValueError, match="must be a folder name, not a path"):
        RunConfig(project=project)


def test_a_checkpoint_pointer_naming_a_folder_outside_is_ignored(tmp_path):
    from coati.distributed.driver.checkpoint import CheckpointManager

    root = tmp_path / "run" / "checkpoints"
    (root / "step-2").mkdir(parents=True)
    (root / "step-2" / "meta.json").write_text("{}")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "meta.json").write_text("{}")
    (root / "latest").write_text("../../outside")
    manager = CheckpointManager.__new__(CheckpointManager)
    manager.root = root
    assert manager.resolve("latest") == root / "step-2"
