"""What the API's connection limits cost on the accept path: new connections per second through
the real app under uvicorn on 127.0.0.1, with the limits (corral.server.connections: a peer's
uid asked of the kernel for every connection, counted, timed) and without (uvicorn's own
httptools protocol); how fast connections over a peer's cap are refused; and what one uid
lookup costs with few and with many sockets open, against reading /proc/net/tcp for it.

Each client is a process that, for --seconds, opens a connection, sends one request (whoami
without a token: answered 401 by the app without the database) with `Connection: close`, and
reads the answer to its end. The server's CPU time per connection (this process's: the clients
are processes of their own) says more than the rate on a machine shared with other work. Prints
figures (medians of --rounds runs, interleaved); never fails on time.

Run: python benchmarks/connection_accept.py [--seconds 5] [--clients 2] [--sockets 10000]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from corral.server.api import create_app
from corral.server.boot import ServerOptions, build_manager
from corral.server.connections import (
    ConnectionGuard,
    ConnectionLimits,
    SocketOwners,
    raise_open_file_limit,
)
from corral.server.manager import ManagerSettings

CLIENT = """
import socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
request = b"GET /api/v1/whoami HTTP/1.1\\r\\nHost: bench\\r\\nConnection: close\\r\\n\\r\\n"
done = refused = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    answer = b""
    with socket.create_connection((host, port)) as connection:
        try:
            connection.sendall(request)
            answer = connection.recv(65536)
            while connection.recv(65536):
                pass
        except OSError:  # (reset after a refusal's answer: the request came after the close)
            pass
    done += 1
    refused += answer.startswith(b"HTTP/1.1 503")
print(done, refused)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """The app under uvicorn in a thread, with `options` for uvicorn.Config."""

    def __init__(self, app: Any, options: dict[str, Any]) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="error", access_log=False, **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join()


def cpu_seconds() -> float:
    """This process's CPU time: the server's (the clients are processes of their own)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def clients(port: int, count: int, seconds: float) -> tuple[int, int]:
    """Connections the clients completed together, and how many were refused."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, "127.0.0.1", str(port), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    done = refused = 0
    for process in processes:
        out, _ = process.communicate()
        finished, turned_away = map(int, out.split())
        done += finished
        refused += turned_away
    return done, refused


def lookup_costs(sockets: int, rounds: int = 2000) -> list[str]:
    """Microseconds per uid lookup (netlink), and milliseconds per /proc/net/tcp read, with
    `sockets` connected sockets open in this process (half of them accepted ends)."""
    lines = []
    owners = SocketOwners()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        held: list[socket.socket] = []
        try:
            for count in sorted({10, sockets}):
                while len(held) < count:
                    held.append(socket.create_connection(listener.getsockname()))
                    held.append(listener.accept()[0])
                accepted = held[-1]
                peer, own = accepted.getpeername(), accepted.getsockname()
                started = time.perf_counter()
                for _ in range(rounds):
                    owners.uid(peer, own)
                netlink_us = (time.perf_counter() - started) / rounds * 1e6
                reads = 20 if count < 1000 else 5
                started = time.perf_counter()
                for _ in range(reads):
                    Path("/proc/net/tcp").read_text().splitlines()
                proc_ms = (time.perf_counter() - started) / reads * 1e3
                lines.append(
                    f"uid lookup with {len(held):,} sockets open: netlink {netlink_us:.0f} us; "
                    f"reading /proc/net/tcp instead {proc_ms:.1f} ms"
                )
        finally:
            for connection in held:
                connection.close()
            owners.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, interleaved")
    args = parser.parse_args()
    open_files = raise_open_file_limit()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"connection_accept: {os.cpu_count()} CPUs, load average {load}, Python "
        f"{platform.python_version()}, Linux {platform.release()}, open-file limit {open_files}"
    )
    print(
        f"  {args.clients} client processes for {args.seconds:g} s a run, {args.rounds} runs of "
        "each; a connection is one request (whoami, 401) and its answer"
    )
    with tempfile.TemporaryDirectory() as temporary:
        options = ServerOptions(
            data_dir=Path(temporary) / "corral",
            gpus=1,
            settings=ManagerSettings(),
            single_user=True,
        )
        manager = build_manager(options)
        try:
            app = create_app(manager)
            runs = [("without limits (uvicorn's httptools)", {"http": "httptools"}, None)]
            guard = ConnectionGuard.start(ConnectionLimits())
            runs.append(
                ("with limits (uid looked up per connection)", guard.uvicorn_options(), None)
            )
            logging.getLogger("corral.connections").setLevel(logging.ERROR)  # (its refusals)
            capped = ConnectionGuard.start(ConnectionLimits(max_per_peer=1))
            runs.append(("over the peer's cap (503 as accepted)", capped.uvicorn_options(), 1))
            rates: dict[str, list[float]] = {name: [] for name, _, _ in runs}
            costs: dict[str, list[float]] = {name: [] for name, _, _ in runs}
            refusals = dict.fromkeys(rates, 0)
            for _ in range(args.rounds):
                for name, server_options, hold in runs:
                    with Server(app, server_options) as server:
                        held = [
                            socket.create_connection(("127.0.0.1", server.port))
                            for _ in range(hold or 0)
                        ]
                        cpu = cpu_seconds()
                        done, refused = clients(server.port, args.clients, args.seconds)
                        cpu = cpu_seconds() - cpu
                        for connection in held:
                            connection.close()
                    rates[name].append(done / args.seconds)
                    costs[name].append(cpu / max(done, 1) * 1e6)
                    refusals[name] += refused
            for name, found in rates.items():
                print(
                    f"  {name:43} {statistics.median(found):6,.0f} connections/s "
                    f"({min(found):,.0f}-{max(found):,.0f}), server CPU "
                    f"{statistics.median(costs[name]):4,.0f} us each; {refusals[name]:,} refused"
                )
            guard.close()
            capped.close()
        finally:
            manager.stop()
    for line in lookup_costs(args.sockets):
        print(f"  {line}")


if __name__ == "__main__":
    main()
