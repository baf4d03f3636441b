"""A job's worker that floods the manager's port (tests/server/test_connection_flood.py): it opens
connections that each send half a request (a request line and part of its headers) and then
hold, `target` of them, and opens a new one for each the manager closes, for as long as it runs.

  python3 flood.py HOST PORT TARGET STATUS_FILE

Every sweep it writes STATUS_FILE (atomically, JSON): connections opened in all, held now,
closed by the manager, and connects that failed. Plain standard library: it runs under
/usr/bin/python3 as the job's account.
"""

from __future__ import annotations

import json
import os
import socket
import sys

HALF_A_REQUEST = b"GET /api/v1/whoami HTTP/1.1\r\nHost: manager\r\nAuthorization: Bear"


def main() -> None:
    host, port, target, status_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    held: list[socket.socket] = []
    counts = {"opened": 0, "held": 0, "closed": 0, "failed": 0, "sweeps": 0}
    while True:
        while len(held) < target:  # top up
            try:
                connection = socket.socket()
            except OSError:  # out of descriptors itself
                counts["failed"] += 1
                break
            try:
                connection.settimeout(10)
                connection.connect((host, port))
                connection.sendall(HALF_A_REQUEST)
                connection.setblocking(False)
            except OSError:
                connection.close()
                counts["failed"] += 1
                break
            held.append(connection)
            counts["opened"] += 1
        still = []
        for connection in held:  # which did the manager close (or answer, which it closes)?
            try:
                connection.recv(4096)
            except BlockingIOError:
                still.append(connection)
                continue
            except OSError:
                pass
            connection.close()
            counts["closed"] += 1
        held = still
        counts["held"] = len(held)
        counts["sweeps"] += 1
        with open(status_file + ".tmp", "w") as out:
            json.dump(counts, out)
        os.replace(status_file + ".tmp", status_file)


if __name__ == "__main__":
    main()
