"""The whole test run happens in a network namespace of its own whose only interface is loopback.

Nothing a test starts can then reach, or advertise, any address but 127.0.0.1: Ray in particular
replaces `--node-ip-address=127.0.0.1` with the machine's routable address when it can find one,
and cannot find one here. Making the namespace needs root (CI and these machines run as root); as
any other user, run the tests under `unshare -rn` (or as root) — the Ray tests check that they
are isolated and fail with that advice otherwise.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def only_loopback() -> bool:
    """Whether this process sees no network interface but loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def _isolate_network() -> None:
    if only_loopback():
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return  # not root: the Ray tests say what to do; the others use 127.0.0.1 anyway
    _loopback_up()


def pytest_configure() -> None:
    # Before any test starts a thread or a process: they all inherit the namespace.
    _isolate_network()
