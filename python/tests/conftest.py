"""Shared pytest set-up for python/tests."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="module")
def _private_catalog(tmp_path_factory):
    """libdcp's catalog in a temporary folder (inherited by spawned ranks), never the user's."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old
