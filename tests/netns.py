"""A network namespace whose only interface is loopback, for the test run and the benchmarks.

Nothing started inside can then reach, or advertise, any address but 127.0.0.1: Ray in particular
replaces `--node-ip-address=127.0.0.1` with the machine's routable address when it can find one,
and cannot find one here. Making the namespace needs root (CI and these machines run as root); as
any other user, run under `unshare -rn`.
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


def only_loopback() -> bool:
    """Whether this process sees no network interface but loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def isolate_network() -> bool:
    """Move this process (before it starts threads or children: they inherit it) into a new
    network namespace with loopback up. False if it cannot (not root)."""
    if only_loopback():
        return True
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
    return True
