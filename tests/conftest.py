"""The whole test run happens in a network namespace of its own whose only interface is loopback
(see tests/netns.py): nothing a test starts can reach or advertise another address. As a user
who cannot make one, run pytest under `unshare -rn`; the Ray tests check that they are isolated
and fail with that advice otherwise.

Every Ray cluster the tests start, and every manager that connects to one, uses token
authentication with a token of the run's own (tests/exec/ray_cluster.py: `use_token_auth`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests.exec.ray_cluster import use_token_auth
from tests.netns import isolate_network

_RUN_DIR = Path(tempfile.mkdtemp(prefix="corral-tests-"))


def pytest_configure() -> None:
    # Before any test starts a thread or a process: they all inherit the namespace.
    isolate_network()
    use_token_auth(_RUN_DIR)


def pytest_unconfigure() -> None:
    shutil.rmtree(_RUN_DIR, ignore_errors=True)
