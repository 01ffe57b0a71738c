"""A pytest plugin for ``-p tests.helpers.xdist_groups``: after collection, print one line
``GROUP <group or -> <nodeid>`` per test (the ``xdist_group`` tests/conftest.py gave it)."""

from __future__ import annotations

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        print(f"GROUP {mark.args[0] if mark else '-'} {item.nodeid}")
