"""Contain every process of an attempt (or of a Ray worker) and end them all with it.

A process group is not a container: `setsid`, a double fork, and every worker `torchrun` starts
(torch uses `start_new_session=True`) leave it. The supervisor (corral.exec.shim, or
corral.exec.guard on a Ray node) uses the kernel instead, in this order of preference:

- **cgroup2**: a cgroup `<root>/corral/<name>` in the writable unified hierarchy (/sys/fs/cgroup
  on a pure-v2 machine, /sys/fs/cgroup/unified on a hybrid one). It is ended by writing 1 to its
  `cgroup.kill` (kernel 5.14; before that its processes are killed one by one until it is empty),
  waiting until `cgroup.events` says `populated 0`, and removing it.
- **cgroup1**: a cgroup of the v1 freezer hierarchy (`<freezer>/corral/<name>`). It is ended by
  freezing it (a frozen process cannot fork, nor exit and let its pid be reused), SIGKILLing every
  process in `cgroup.procs`, thawing it, and so again until it is empty; then it is removed.
- **subreaper** only: always on as well. The supervisor is a child subreaper (prctl
  PR_SET_CHILD_SUBREAPER), so a process whose parent dies is re-parented to it rather than to
  init; at the end it SIGKILLs every process whose chain of parents leads to it, again and again
  until there is none. Without cgroups (not root, no cgroupfs) nothing escapes this either, except
  a process re-parented elsewhere: the descendants of a supervisor that itself died (a lost
  attempt; `end_recorded` then finds them by `KEY_VARIABLE` in their environment, unless they
  removed it), or a process that a daemon started on the job's behalf (`systemd-run`, `at`, ssh).

Processes join the container by inheritance: the supervisor moves itself into the cgroups,
starts a worker (which is born there, before it runs a single instruction of its own), and moves
itself back out (`Container.entered`). This works whatever account the worker runs as.

**GPU device files.** Where the v1 devices controller is mounted and the supervisor is root, a
container given the GPU indexes it may use denies every other `/dev/nvidia<i>` (by the device
number of that file) in a cgroup `<devices>/corral/<name>`: a worker opening another GPU's device
file gets EPERM. It is a deny list, not an allow list: v1 starts a child cgroup from its parent's
"allow all", where writing `c 195:* rwm` to `devices.deny` and then `c 195:1 rwm` to
`devices.allow` leaves 195:1 denied (an allow only removes an identical deny entry), and an
allow list of every device a job may need (InfiniBand, /dev/shm's neighbours, nvidia-uvm, caps)
would break jobs on machines that have more. The minor of GPU i is taken from `/dev/nvidia<i>`,
as the NVIDIA driver numbers its device files in the order NVML indexes GPUs. cgroup v2 controls
devices only through eBPF programs attached to the cgroup (BPF_CGROUP_DEVICE): not done here, so
on a pure-v2 machine the device files are not restricted.

**Limits.** A container given `Limits` caps what its processes use together: memory (RAM, and
swap with it), CPU time per wall second, and tasks (processes and threads, so that a fork bomb
stops at its own cap, far below the host's pid_max). Each limit goes where its controller is:
in the container's own cgroup when that is a v2 one whose hierarchy has the controller
(`memory.max` with `memory.swap.max` 0, `cpu.max`, `pids.max`), else in a cgroup
`<controller>/corral/<name>` of that controller's v1 hierarchy, entered like the devices one
(`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where swap is accounted, so that
swapping does not evade it; `cpu.cfs_quota_us` over `cpu.cfs_period_us`; `pids.max`). A hybrid
machine (containers in the unified hierarchy, controllers in v1) mixes both. A limit that cannot
be set is not silently dropped: `Container.unenforced` names it with the reason, and
`limits_unavailable` says before any attempt which ones this machine cannot enforce. The kernel
kills a process of a container at its memory limit (`oom_kills` counts them: memory.events'
`oom_kill` on v2, memory.oom_control's on v1).

`CORRAL_CONTAIN` (or the `mechanism` argument) picks one: auto (the default: the first
available of the above), cgroup2, cgroup1 or subreaper. A mechanism asked for by name that is
not available is an error (`ContainError`), not a silent fallback.

Only the standard library: the shim imports this module and must start fast.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The environment variable that picks a mechanism (auto, cgroup2, cgroup1, subreaper).
ENV_MECHANISM = "CORRAL_CONTAIN"
MECHANISMS = ("auto", "cgroup2", "cgroup1", "subreaper")
#: Set in every worker's environment to the container's unique name: how the processes of a
#: supervisor that died are found when no cgroup holds them.
KEY_VARIABLE = "CORRAL_CONTAINER"
#: How long ending a container may take before what is left is reported as left over.
END_TIMEOUT_S = 10.0
#: The directory under each hierarchy's root that holds the containers.
CGROUP_DIR = "corral"
PR_SET_CHILD_SUBREAPER = 36
#: nvidiactl, nvidia-modeset and the like share the GPUs' major; only nvidia<N> files are GPUs.
GPU_FILE = re.compile(r"nvidia(\d+)")
#: Each limit of `Limits` and the controller that enforces it.
LIMIT_CONTROLLERS = {"memory": "memory", "cpus": "cpu", "pids": "pids"}
#: The period a CPU quota is given over (the kernel's default for cpu.max and cfs_period_us).
CPU_PERIOD_US = 100_000
#: The smallest quota the kernel takes (1 ms a period): `cpus` 0.01.
MIN_CPU_QUOTA_US = 1_000
#: The most tasks (processes and threads) an attempt has at once unless the operator says
#: otherwise: far above what a training job starts (a worker per GPU, a data loader's
#: processes each, their threads), far below a host's pid_max, so that a fork bomb stops at
#: its own cap and the manager and the other jobs can still fork.
DEFAULT_PIDS_MAX = 8192


class ContainError(Exception):
    """A container could not be made as asked (one line, for the attempt's reason)."""


@dataclass(slots=True, frozen=True)
class Limits:
    """What a container's processes may use together; None: no limit of that kind.

    `memory_bytes`: RAM, swap included; `cpus`: CPU seconds per wall second (0.5 is half a CPU);
    `pids`: tasks (processes and threads) at once."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None

    def asked(self) -> list[str]:
        """The names (LIMIT_CONTROLLERS) of the limits that are set."""
        values = {"memory": self.memory_bytes, "cpus": self.cpus, "pids": self.pids}
        return [name for name, value in values.items() if value is not None]

    def record(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "cpus": self.cpus, "pids": self.pids}

    @classmethod
    def parse(cls, value: object) -> Limits:
        """`record()`'s dict (None: no limits); ValueError naming the field if it is not one."""
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ValueError("limits: not an object")
        memory, cpus, pids = value.get("memory_bytes"), value.get("cpus"), value.get("pids")
        for name, number in (("memory_bytes", memory), ("pids", pids)):
            if number is not None and (type(number) is not int or number < 1):
                raise ValueError(f"limits.{name}: not a positive integer")
        if cpus is not None and (
            type(cpus) not in (int, float) or not 0 < float(cpus) < float("inf")
        ):
            raise ValueError("limits.cpus: not a positive number")
        return cls(memory, None if cpus is None else float(cpus), pids)


def default_pids_max(pid_max_file: Path = Path("/proc/sys/kernel/pid_max")) -> int:
    """DEFAULT_PIDS_MAX, or a quarter of this host's pid_max where that is less."""
    try:
        pid_max = int(pid_max_file.read_text())
    except (OSError, ValueError):
        return DEFAULT_PIDS_MAX
    return max(1, min(DEFAULT_PIDS_MAX, pid_max // 4))


def size_text(count: int) -> str:
    """Bytes as people write memory sizes: 512 MiB, 16 GiB, 1.5 GiB, 4096 bytes."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if count >= unit:
            return f"{round(count / unit, 2):g} {name}"
    return f"{count} bytes"


def cpu_quota_us(cpus: float) -> int:
    """The quota of `cpus` CPUs per CPU_PERIOD_US (at least the kernel's least)."""
    return max(MIN_CPU_QUOTA_US, round(cpus * CPU_PERIOD_US))


# ---------------------------------------------------------------------------------------------
# Small helpers


def become_subreaper() -> bool:
    """Make this process a child subreaper: orphaned descendants are re-parented to it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _procs(cgroup: Path) -> list[int]:
    """The processes in a cgroup ([] when it is gone)."""
    try:
        text = (cgroup / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(line) for line in text.split()]


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state letter, start time in clock ticks) of a process, from /proc/PID/stat, or
    None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            data = stat_file.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state), fields[1] field 4 (ppid); field 22 (starttime) is fields[19].
    return int(fields[1]), fields[0].decode(), int(fields[19])


def _kill(pid: int, start_time: int | None = None) -> bool:
    """SIGKILL `pid`; with `start_time`, only if it is still the process that started then
    (checked through a pidfd, so that a pid reused meanwhile is left alone)."""
    if start_time is None:
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # a kernel without pidfds: the small race is accepted
        return _kill(pid)
    try:
        found = proc_stat(pid)
        if found is None or found[2] != start_time:
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def _sleep(step: float, deadline: float) -> float:
    """Sleep a little (longer each time, at most 50 ms, never past the deadline)."""
    time.sleep(max(0.0, min(step, deadline - time.monotonic())))
    return min(step * 2, 0.05)


def descendants(root: int) -> dict[int, tuple[int, str, int]]:
    """Every process whose chain of parents leads to `root`: pid -> (ppid, state, start time)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        found = proc_stat(int(entry))
        if found is not None:
            stats[int(entry)] = found
            children.setdefault(found[0], []).append(int(entry))
    result: dict[int, tuple[int, str, int]] = {}
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if pid in result or pid == root:
            continue
        result[pid] = stats[pid]
        stack.extend(children.get(pid, []))
    return result


def own_children() -> list[int]:
    """This process's children (all threads'), from /proc/self/task/*/children."""
    found: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return [pid for pid, info in descendants(os.getpid()).items() if info[0] == os.getpid()]
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as children:
                found.extend(int(pid) for pid in children.read().split())
        except OSError:  # a kernel without CONFIG_PROC_CHILDREN
            me = os.getpid()
            return [pid for pid, info in descendants(me).items() if info[0] == me]
    return found


def reap_orphans(keep: Iterable[int] = ()) -> int:
    """Reap this process's exited children other than `keep` (the ones a Popen waits for):
    orphans re-parented to a subreaper would otherwise stay zombies. Returns how many."""
    kept = set(keep)
    reaped = 0
    for pid in own_children():
        if pid in kept:
            continue
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                reaped += 1
        except ChildProcessError:
            pass
    return reaped


def sweep(keep: Iterable[int] = (), deadline: float | None = None) -> tuple[set[int], list[int]]:
    """SIGKILL every descendant of this process until there is none (a killed process's
    children are re-parented to this subreaper, and found by the next round); reap the ones
    that become zombies here, except `keep` (their Popen reaps them). Returns (the pids killed,
    the live ones still there at the deadline)."""
    me = os.getpid()
    kept = set(keep)
    deadline = time.monotonic() + END_TIMEOUT_S if deadline is None else deadline
    killed: set[int] = set()
    step = 0.002
    while True:
        found = descendants(me)
        for pid, (ppid, state, _) in found.items():
            if ppid == me and state in ("Z", "X") and pid not in kept:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        live = {pid: info for pid, info in found.items() if info[1] not in ("Z", "X")}
        if not live:
            return killed, []
        if time.monotonic() >= deadline:
            return killed, sorted(live)
        for pid, (ppid, _, start_time) in live.items():
            # A child's pid cannot be reused until it is reaped here; a grandchild's can.
            if _kill(pid, None if ppid == me else start_time):
                killed.add(pid)
        step = _sleep(step, deadline)


# ---------------------------------------------------------------------------------------------
# Finding the hierarchies


@dataclass(slots=True, frozen=True)
class _Mount:
    point: Path
    root: str  # the hierarchy's directory mounted there (mountinfo's field 4)
    fstype: str
    options: frozenset[str]


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)


def _cgroup_mounts() -> list[_Mount]:
    mounts = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
            lines = mountinfo.read().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if "-" not in parts:
            continue
        sep = parts.index("-")
        fstype = parts[sep + 1] if len(parts) > sep + 1 else ""
        if fstype not in ("cgroup", "cgroup2"):
            continue
        options = frozenset(parts[sep + 3].split(",")) if len(parts) > sep + 3 else frozenset()
        mounts.append(_Mount(Path(_unescape(parts[4])), _unescape(parts[3]), fstype, options))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: "" for v2, else each v1 controller's name."""
    found: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as cgroups:
            lines = cgroups.read().splitlines()
    except OSError:
        return found
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            found[""] = path
        for controller in controllers.split(","):
            if controller:
                found[controller] = path
    return found


@dataclass(slots=True, frozen=True)
class _Hierarchy:
    mount: Path  # where it is mounted
    here: Path  # the cgroup this process is in (where a supervisor returns to)


def _hierarchy(controller: str) -> _Hierarchy | None:
    """The writable hierarchy of `controller` ("" for the unified one) and this process's
    cgroup in it; None if there is none."""
    own = _own_cgroups().get(controller)
    if own is None:
        return None
    for mount in _cgroup_mounts():
        if controller == "":
            if mount.fstype != "cgroup2":
                continue
        elif mount.fstype != "cgroup" or controller not in mount.options:
            continue
        root = mount.root.rstrip("/")
        if own != root and not own.startswith(root + "/"):
            continue  # this process's cgroup is not under what is mounted there
        if not os.access(mount.point, os.W_OK):
            continue
        here = mount.point / own[len(root) :].lstrip("/")
        if (here / "cgroup.procs").exists():
            return _Hierarchy(mount.point, here)
    return None


def unavailable(mechanism: str) -> str | None:
    """Why `mechanism` cannot be used here, or None when it can (for tests and messages)."""
    if mechanism == "subreaper":
        return None
    if mechanism not in ("cgroup2", "cgroup1"):
        return f"unknown mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})"
    if os.geteuid() != 0:
        return f"{mechanism} needs root"
    if mechanism == "cgroup2":
        return None if _hierarchy("") else "no writable cgroup v2 hierarchy"
    return None if _hierarchy("freezer") else "no writable cgroup v1 freezer hierarchy"


def devices_unavailable() -> str | None:
    """Why GPU device files cannot be restricted here, or None when they can."""
    if os.geteuid() != 0:
        return "restricting device files needs root"
    if _hierarchy("devices") is None:
        return "no cgroup v1 devices hierarchy (cgroup v2 would need eBPF)"
    return None


def limits_unavailable(mechanism: str | None = None) -> dict[str, str]:
    """Why each limit (memory, cpus, pids) cannot be enforced on this machine with `mechanism`
    (None: $CORRAL_CONTAIN, else auto), found by trying: a container with every limit is made,
    without a process, and removed at once. {} when every limit can be."""
    names = list(LIMIT_CONTROLLERS)
    if os.geteuid() != 0:
        return {name: f"{name}: limits need root: they are cgroups" for name in names}
    probe = Limits(memory_bytes=1 << 50, cpus=float(os.cpu_count() or 1), pids=1 << 22)
    try:
        container = Container._build("limits-probe", mechanism, None, Path("/dev"), probe)
    except (ContainError, OSError) as error:
        return {name: f"{name}: no container ({error})" for name in names}
    container.remove()
    return dict(container.unenforced)


def gpu_device_numbers(device_dir: Path) -> dict[int, tuple[int, int]]:
    """GPU index -> (major, minor) of each `nvidia<N>` character device in `device_dir`."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = list(os.scandir(device_dir))
    except OSError:
        return found
    for entry in entries:
        match = GPU_FILE.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = os.stat(entry.path)
        except OSError:
            continue
        if stat.S_ISCHR(info.st_mode):
            found[int(match.group(1))] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    return found


# ---------------------------------------------------------------------------------------------
# The container


def _sanitize(hint: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", hint).strip("._")[:80] or "attempt"


@dataclass(slots=True)
class Container:
    """One attempt's (or one Ray worker's) processes; see the module's docstring."""

    name: str
    mechanism: str  # cgroup2, cgroup1 or subreaper
    #: The cgroup whose processes are the container's (v2, or v1 freezer); None: subreaper only.
    cgroup: Path | None = None
    #: The v1 devices cgroup that denies other GPUs' device files; None when not restricted.
    devices: Path | None = None
    denied: list[str] = field(default_factory=list)
    #: (a cgroup of the container, this process's own cgroup in the same hierarchy).
    joins: list[tuple[Path, Path]] = field(default_factory=list)
    #: The limits asked for, and the cgroup that holds each one that is set (by name).
    limits: Limits = field(default_factory=Limits)
    limit_cgroups: dict[str, Path] = field(default_factory=dict)
    #: The limits asked for that could not be set, and why (one line each).
    unenforced: dict[str, str] = field(default_factory=dict)
    #: The v1 cgroups made for limits only (not `cgroup` nor `devices`).
    limit_only: list[Path] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        hint: str,
        mechanism: str | None = None,
        gpu_devices: list[int] | None = None,
        device_dir: Path = Path("/dev"),
        limits: Limits | None = None,
    ) -> Container:
        """Make a container named after `hint` (e.g. job id and attempt; made unique here).
        `mechanism` None: $CORRAL_CONTAIN, else auto. `gpu_devices` None: no device rules.
        `limits` that cannot be set are named in `unenforced`; the container is made anyway."""
        become_subreaper()
        return cls._build(hint, mechanism, gpu_devices, device_dir, limits)

    @classmethod
    def _build(
        cls,
        hint: str,
        mechanism: str | None,
        gpu_devices: list[int] | None,
        device_dir: Path,
        limits: Limits | None,
    ) -> Container:
        wanted = mechanism or os.environ.get(ENV_MECHANISM) or "auto"
        if wanted not in MECHANISMS:
            raise ContainError(f"unknown mechanism {wanted!r} (one of {', '.join(MECHANISMS)})")
        name = f"{_sanitize(hint)}-{os.getpid()}-{os.urandom(3).hex()}"
        container = cls(name, "subreaper")
        try:
            for candidate in ("cgroup2", "cgroup1") if wanted == "auto" else (wanted,):
                if candidate == "subreaper":
                    break
                why = unavailable(candidate)
                if why is None:
                    try:
                        container._make(candidate)
                        break
                    except OSError as error:
                        why = f"cannot create its cgroup: {error}"
                if wanted != "auto":
                    raise ContainError(f"{candidate}: {why}")
            if gpu_devices is not None:
                container._restrict_devices(gpu_devices, device_dir)
            if limits is not None:
                container._limit(limits)
        except BaseException:
            container.remove()
            raise
        return container

    def _make(self, mechanism: str) -> None:
        hierarchy = _hierarchy("" if mechanism == "cgroup2" else "freezer")
        assert hierarchy is not None
        self.cgroup = self._mkdir(hierarchy)
        self.mechanism = mechanism
        self.joins.append((self.cgroup, hierarchy.here))

    def _mkdir(self, hierarchy: _Hierarchy) -> Path:
        parent = hierarchy.mount / CGROUP_DIR
        try:
            parent.mkdir(mode=0o755)
        except FileExistsError:
            _remove_stale(parent)
        path = parent / self.name
        path.mkdir(mode=0o755)
        return path

    def _limit(self, limits: Limits) -> None:
        self.limits = limits
        for name in limits.asked():
            controller = LIMIT_CONTROLLERS[name]
            try:
                cgroup, v2 = self._limit_cgroup(controller)
                _set_limit(cgroup, v2, name, limits)
            except (OSError, _NoController) as error:
                why = str(error) if isinstance(error, _NoController) else _os_error(error)
                self.unenforced[name] = f"{name}: {why}"
                continue
            self.limit_cgroups[name] = cgroup

    def _limit_cgroup(self, controller: str) -> tuple[Path, bool]:
        """The cgroup of this container that holds `controller`'s limit, and whether it is a v2
        one: the container's own v2 cgroup where its hierarchy has the controller, else one of
        the controller's v1 hierarchy (made here, or shared with a co-mounted one)."""
        no_v2 = ""
        if self.mechanism == "cgroup2" and self.cgroup is not None:
            try:
                _enable_v2(self.cgroup, controller)
                return self.cgroup, True
            except _NoController as error:
                no_v2 = f"{error}, and "
        if os.geteuid() != 0:
            raise _NoController("limits need root: they are cgroups")
        hierarchy = _hierarchy(controller)
        if hierarchy is None:
            raise _NoController(f"{no_v2}no writable cgroup v1 {controller} hierarchy")
        for cgroup, _ in self.joins:
            if cgroup.parent.parent == hierarchy.mount:  # co-mounted with one joined already
                return cgroup, False
        cgroup = self._mkdir(hierarchy)
        self.limit_only.append(cgroup)
        self.joins.append((cgroup, hierarchy.here))
        return cgroup, False

    def oom_kills(self) -> int:
        """How many of the container's processes the kernel killed at its memory limit (0
        without one). A v1 kernel before 4.13 has no count: every time the limit was hit
        (memory.failcnt) counts then."""
        cgroup = self.limit_cgroups.get("memory")
        if cgroup is None:
            return 0
        v2 = self.mechanism == "cgroup2" and cgroup == self.cgroup
        counts = _key_values(cgroup / ("memory.events" if v2 else "memory.oom_control"))
        if "oom_kill" in counts:
            return counts["oom_kill"]
        try:
            return 0 if v2 else int((cgroup / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def _restrict_devices(self, allowed: list[int], device_dir: Path) -> None:
        if devices_unavailable() is not None:
            return
        gpus = gpu_device_numbers(device_dir)
        denied = sorted({gpus[index] for index in gpus if index not in set(allowed)})
        if not gpus:
            return  # no GPU device files here: nothing to deny
        hierarchy = _hierarchy("devices")
        assert hierarchy is not None
        try:
            self.devices = self._mkdir(hierarchy)
        except OSError:
            return
        self.joins.append((self.devices, hierarchy.here))
        for major, minor in denied:
            rule = f"c {major}:{minor} rwm"
            _write(self.devices / "devices.deny", rule)
            self.denied.append(rule)

    def record(self) -> dict[str, Any]:
        """What a supervisor writes down so that `end_recorded` can end the container if the
        supervisor itself dies."""
        return {
            "name": self.name,
            "mechanism": self.mechanism,
            "cgroup": None if self.cgroup is None else str(self.cgroup),
            "devices": None if self.devices is None else str(self.devices),
            "denied": list(self.denied),
            "limits": self.limits.record(),
            "limit_cgroups": {name: str(path) for name, path in self.limit_cgroups.items()},
            "limit_only": [str(path) for path in self.limit_only],
            "unenforced": dict(self.unenforced),
        }

    @contextmanager
    def entered(self) -> Iterator[None]:
        """Inside, this process is in the container's cgroups: a child it starts is born there.
        The caller must be single-threaded meanwhile (another thread's children would be too)."""
        me = str(os.getpid())
        moved: list[tuple[Path, Path]] = []
        try:
            for cgroup, home in self.joins:
                _write(cgroup / "cgroup.procs", me)
                moved.append((cgroup, home))
            yield
        finally:
            for cgroup, home in reversed(moved):
                try:
                    _write(home / "cgroup.procs", me)
                except OSError:  # gone: anywhere outside the container will do
                    _write(cgroup.parent / "cgroup.procs", me)

    def end(self, keep: Iterable[int] = (), timeout_s: float = END_TIMEOUT_S) -> list[int]:
        """SIGKILL every process of the container and wait until they are gone; remove its
        cgroups. `keep`: this process's children that a Popen will reap (killed, not reaped).
        Returns the pids still alive after `timeout_s` (processes that cannot die: stuck in
        the kernel, or frozen by someone else), [] when all ended."""
        deadline = time.monotonic() + timeout_s
        self._leave()
        plain = [self.devices, *self.limit_only]
        _, left = _end_cgroups(self.mechanism, self.cgroup, plain, deadline)
        _, swept = sweep(keep, deadline)
        left_over = sorted(set(left) | set(swept))
        if not left_over:
            self.remove()
        return left_over

    def _leave(self) -> None:
        """Make sure this process is not in a cgroup it is about to kill."""
        me = os.getpid()
        for cgroup, home in self.joins:
            if me in _procs(cgroup):
                try:
                    _write(home / "cgroup.procs", str(me))
                except OSError:
                    _write(cgroup.parent / "cgroup.procs", str(me))

    def remove(self) -> None:
        for path in (self.cgroup, self.devices, *self.limit_only):
            if path is not None:
                _rmdir(path)


class _NoController(Exception):
    """A limit's controller is not to be had here (one line)."""


def _os_error(error: OSError) -> str:
    return f"cannot set it: {error.strerror or error}" + (
        f" ({error.filename})" if error.filename else ""
    )


def _enable_v2(cgroup: Path, controller: str) -> None:
    """Make `controller` available in `cgroup` (<mount>/corral/<name>): enabled in the
    subtree_control of corral's cgroup, and of the hierarchy's top where it is not yet (the top
    may hold processes; corral's cgroup never does, so it may enable controllers)."""
    parent = cgroup.parent
    try:
        if controller in (parent / "cgroup.subtree_control").read_text().split():
            return
        if controller not in (parent / "cgroup.controllers").read_text().split():
            top = parent.parent
            if controller not in (top / "cgroup.controllers").read_text().split():
                raise _NoController(f"the cgroup v2 hierarchy has no {controller} controller")
            _write(top / "cgroup.subtree_control", f"+{controller}")
        _write(parent / "cgroup.subtree_control", f"+{controller}")
    except OSError as error:
        raise _NoController(
            f"cannot enable the cgroup v2 {controller} controller ({error.strerror or error})"
        ) from None


def _set_limit(cgroup: Path, v2: bool, name: str, limits: Limits) -> None:
    if name == "memory":
        assert limits.memory_bytes is not None
        amount = str(limits.memory_bytes)
        if v2:
            _write(cgroup / "memory.max", amount)
            if (cgroup / "memory.swap.max").exists():  # swap counts apart on v2: none at all
                _write(cgroup / "memory.swap.max", "0")
        else:
            _write(cgroup / "memory.limit_in_bytes", amount)
            if (cgroup / "memory.memsw.limit_in_bytes").exists():  # memory and swap together
                _write(cgroup / "memory.memsw.limit_in_bytes", amount)
    elif name == "cpus":
        assert limits.cpus is not None
        quota = cpu_quota_us(limits.cpus)
        if v2:
            _write(cgroup / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            _write(cgroup / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cgroup / "cpu.cfs_quota_us", str(quota))
    else:
        assert limits.pids is not None
        _write(cgroup / "pids.max", str(limits.pids))


def _key_values(path: Path) -> dict[str, int]:
    """A cgroup file of `key value` lines (memory.events, memory.oom_control) as a dict."""
    found: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def _rmdir(path: Path) -> bool:
    for _ in range(50):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY:
                return False
            time.sleep(0.01)  # the last exit is still being accounted
    return False


def _remove_stale(parent: Path) -> None:
    """Remove the empty cgroups of supervisors that are gone (one killed before it recorded its
    container, or whose leftover processes died since): only its creator ever joins a cgroup,
    so one whose creator is gone and that holds nothing is of no use to anyone."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        parts = entry.name.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        if os.path.exists(f"/proc/{parts[1]}"):
            continue  # its creator (or a process that reuses its pid) lives
        path = Path(entry.path)
        if not _procs(path) and not _populated(path):
            try:
                path.rmdir()
            except OSError:
                pass


def _populated(cgroup: Path) -> bool:
    try:
        events = (cgroup / "cgroup.events").read_text()
    except OSError:
        return bool(_procs(cgroup))
    return "populated 1" in events


def _end_cgroup2(cgroup: Path, deadline: float) -> tuple[set[int], list[int]]:
    killed = set(_procs(cgroup))
    step = 0.002
    kill_file = cgroup / "cgroup.kill"
    while _populated(cgroup):
        if time.monotonic() >= deadline:
            return killed, _procs(cgroup)
        if kill_file.exists():
            try:
                _write(kill_file, "1")
            except FileNotFoundError:
                break
        else:  # before 5.14: one by one, until no fork outran the kills
            for pid in _procs(cgroup):
                killed.add(pid)
                _kill(pid)
        step = _sleep(step, deadline)
    return killed, []


def _end_freezer(cgroup: Path, deadline: float) -> tuple[set[int], list[int]]:
    killed: set[int] = set()
    state = cgroup / "freezer.state"
    step = 0.002
    while _procs(cgroup):
        if time.monotonic() >= deadline:
            break
        try:
            _write(state, "FROZEN")
            frozen_by = min(deadline, time.monotonic() + 1.0)
            # A process in uninterruptible sleep keeps it FREEZING: kill what there is anyway.
            while state.read_text().strip() != "FROZEN" and time.monotonic() < frozen_by:
                time.sleep(0.002)
            for pid in _procs(cgroup):  # frozen: none can fork, or exit and free its pid
                if _kill(pid):
                    killed.add(pid)
        except FileNotFoundError:
            return killed, []
        finally:
            try:
                _write(state, "THAWED")
            except FileNotFoundError:
                pass
        step = _sleep(step, deadline)
    return killed, _procs(cgroup)


def _end_plain(cgroup: Path, deadline: float) -> tuple[set[int], list[int]]:
    """A v1 cgroup without a freezer (devices): kill its processes until it is empty."""
    killed: set[int] = set()
    step = 0.002
    while pids := _procs(cgroup):
        if time.monotonic() >= deadline:
            return killed, pids
        for pid in pids:
            if _kill(pid):
                killed.add(pid)
        step = _sleep(step, deadline)
    return killed, []


def _end_cgroups(
    mechanism: str, cgroup: Path | None, plain: Iterable[Path | None], deadline: float
) -> tuple[set[int], list[int]]:
    """End the container's own cgroup (v2, or v1 freezer), then the v1 cgroups without a
    freezer (devices, limits), which hold the same processes: whatever is left in them."""
    killed: set[int] = set()
    left: list[int] = []
    if cgroup is not None:
        end = _end_cgroup2 if mechanism == "cgroup2" else _end_freezer
        killed, left = end(cgroup, deadline)
    for other in plain:
        if other is not None:
            more, left_here = _end_plain(other, deadline)
            killed |= more
            left = sorted(set(left) | set(left_here))
    return killed, left


# ---------------------------------------------------------------------------------------------
# Ending a container whose supervisor died


def _recorded_cgroup(path: object) -> Path | None:
    """A cgroup path from a record, if it is one of ours: <a cgroup mount>/corral/<name>."""
    if not isinstance(path, str) or not path:
        return None
    cgroup = Path(path)
    if cgroup.parent.name != CGROUP_DIR or ".." in cgroup.parts:
        return None
    if not any(cgroup.parent.parent == mount.point for mount in _cgroup_mounts()):
        return None
    return cgroup


def processes_with_key(name: str) -> dict[int, int]:
    """pid -> start time of the live processes whose environment has KEY_VARIABLE=name."""
    wanted = f"{KEY_VARIABLE}={name}".encode()
    found: dict[int, int] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                items = environ.read().split(b"\0")
        except OSError:
            continue
        if wanted in items:
            info = proc_stat(int(entry))
            if info is not None and info[1] not in ("Z", "X"):
                found[int(entry)] = info[2]
    return found


def end_recorded(
    record: dict[str, Any], timeout_s: float = END_TIMEOUT_S
) -> tuple[set[int], list[int]]:
    """End the container described by `record` (`Container.record`) from outside, after its
    supervisor died: its cgroups, and the processes that carry its key in their environment
    (what a subreaper-only container's orphans still have). Returns (the pids killed, the pids
    left over)."""
    deadline = time.monotonic() + timeout_s
    cgroup = _recorded_cgroup(record.get("cgroup"))
    limit_only = record.get("limit_only")
    plain = [_recorded_cgroup(record.get("devices"))] + [
        _recorded_cgroup(path) for path in (limit_only if isinstance(limit_only, list) else [])
    ]
    mechanism = str(record.get("mechanism", ""))
    killed, left = _end_cgroups(mechanism, cgroup, plain, deadline)
    name = record.get("name")
    if isinstance(name, str) and name:
        step = 0.002
        while found := processes_with_key(name):
            if time.monotonic() >= deadline:
                left = sorted(set(left) | set(found))
                break
            for pid, start_time in found.items():
                if _kill(pid, start_time):
                    killed.add(pid)
            step = _sleep(step, deadline)
    if not left:
        for path in (cgroup, *plain):
            if path is not None:
                _rmdir(path)
    return killed, left
