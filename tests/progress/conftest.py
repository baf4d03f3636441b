from __future__ import annotations

from collections.abc import Iterator

import pytest

import corral.progress as progress


@pytest.fixture(autouse=True)
def _fresh_writer() -> Iterator[None]:
    """Each test starts with no progress file open in this process, and leaves none."""
    progress._close()
    yield
    progress._close()
