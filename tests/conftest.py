"""The whole test run happens in a network namespace of its own whose only interface is loopback
(see tests/netns.py): nothing a test starts can reach or advertise another address. As a user
who cannot make one, run pytest under `unshare -rn`; the Ray tests check that they are isolated
and fail with that advice otherwise."""

from __future__ import annotations

from tests.netns import isolate_network


def pytest_configure() -> None:
    # Before any test starts a thread or a process: they all inherit the namespace.
    isolate_network()
