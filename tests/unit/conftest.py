"""Unit-suite settings: an exception that ends a thread fails the test that started the thread.

pytest only warns about such exceptions; a loop thread that dies is a silent outage in the agent or
the operator (attribution or sampling stops for good), so here it is an error.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"))
