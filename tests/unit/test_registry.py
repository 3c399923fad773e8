"""Names resolved to objects: the registries, and user code named ``module:function``, found the same way by every
entry point (the current folder first, then the data file's folder) and refused in one line when it cannot load."""

import sys

import pytest

from coati import registry
from coati.distributed.reward import REWARD_FNS, resolve_reward_fn
from coati.registry import use_user_folders, user_folders


@pytest.fixture
def clean_path(monkeypatch):
    """sys.path, sys.modules and the user folders as they were, after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(registry, "USER_FOLDERS", [])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_a_reward_beside_the_data_is_found_from_another_folder(tmp_path, monkeypatch, clean_path):
    (tmp_path / "user").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "user" / "beside_data_reward.py").write_text("def exact(completions, **kw):\n    return [1.0]\n")
    (tmp_path / "user" / "data.jsonl").write_text('{"prompt": "q"}\n')
    monkeypatch.chdir(tmp_path / "elsewhere")
    folders = user_folders([str(tmp_path / "user" / "data.jsonl"), None])
    assert folders == [str(tmp_path / "elsewhere"), str(tmp_path / "user")]
    use_user_folders(folders)
    assert resolve_reward_fn("beside_data_reward:exact")(["x"]) == [1.0]
    assert registry.USER_FOLDERS == folders and sys.path[:2] == folders


def test_a_missing_module_names_where_it_was_looked_for(tmp_path, monkeypatch, clean_path):
    monkeypatch.chdir(tmp_path)
    use_user_folders(user_folders([]))
    with pytest.raises(ValueError) as e:
        resolve_reward_fn("no_such_reward_module:fn")
    assert str(e.value) == (
        f"cannot import module 'no_such_reward_module' for reward function 'no_such_reward_module:fn': no "
        f"no_such_reward_module.py in {tmp_path} (looked there first, then on the Python path); put it in the current "
        "folder or beside the data file"
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def fn(completions:\n    return []\n", r"has a syntax error at .*broken_\w+\.py:1: "),
        ("x = 1\nraise RuntimeError('no GPU here')\n", r"failed at .*broken_\w+\.py:2: RuntimeError: no GPU here$"),
        ("import not_installed_pkg_xyz\n", r"failed at .*broken_\w+\.py:1: ModuleNotFoundError: No module named"),
    ],
)
def test_a_module_that_fails_to_import_is_one_line_naming_file_and_line(
    tmp_path, monkeypatch, clean_path, source, expected
):
    name = f"broken_{abs(hash(source)) % 10**6}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    use_user_folders(user_folders([]))
    with pytest.raises(ValueError, match=expected) as e:
        resolve_reward_fn(f"{name}:fn")
    assert "\n" not in str(e.value) and e.value.__cause__ is None


def test_registered_names_still_resolve_without_any_import():
    assert resolve_reward_fn("math") is REWARD_FNS.get("math")
