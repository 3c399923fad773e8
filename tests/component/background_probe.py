"""Run by tests/component/test_background.py as a suite of its own (not collected by the suite): background tests that
pass, fail and skip, and one in the suite's process; each records where it ran in the file BACKGROUND_PROBE names."""

import json
import os

import pytest


def _record(name):
    with open(os.environ["BACKGROUND_PROBE"], "a") as f:
        f.write(json.dumps({"test": name, "pid": os.getpid(), "nice": os.nice(0)}) + "\n")


def test_in_the_suite():
    _record("suite")


@pytest.mark.background
def test_passes_beside():
    _record("passes")


@pytest.mark.background
def test_fails_beside():
    _record("fails")
    assert 1 + 1 == 3, "the background failure's own message"


@pytest.mark.background
def test_skips_beside():
    pytest.skip("a reason given beside")
