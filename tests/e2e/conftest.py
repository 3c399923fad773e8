"""Fixtures the e2e tests share."""

import pytest

from coati.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama-layout model folder, one per test module."""
    return str(build_tiny_model(tmp_path_factory.mktemp("e2e_model"), vocab_multiple=8))
