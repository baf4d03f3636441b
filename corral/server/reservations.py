"""The live manager's reservations: GPUs claimed over a time window for some users or VCs
(corral.core.reservations decides what they mean; this part keeps them).

An admin makes one (`create_reservation`: a name, a count of GPUs or a list of nodes, a start on
the manager's clock, a duration, the users and VCs it serves) or deletes it. Each is written to
the store's `reservations` table in the same change that makes it in the core, by GPU names
("node/device"), and the manager makes every stored one again in each core it builds (at start,
after a rebuild from the store, when the cluster changes): a reservation outlives a restart.
Reservations whose window is over are kept until deleted (`corral reservation ls` shows them as
ended); the core forgets them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from corral.core.reservations import Reservation, ReservationError, choose_gpus
from corral.core.text import count_noun
from corral.server.controls import ControlError
from corral.server.state import gpu_ids_by_name
from corral.server.store import ReservationRow, Store

if TYPE_CHECKING:
    from corral.core.cluster import Cluster
    from corral.core.protocol import SchedulerCore


def _core_reservation(row: ReservationRow, ids: dict[str, int]) -> Reservation | None:
    gpus = tuple(sorted(ids[name] for name in row.gpus if name in ids))
    if not gpus:
        return None  # its nodes are gone
    return Reservation(
        row.name,
        row.start,
        row.duration,
        gpus,
        users=frozenset(row.users),
        vcs=frozenset(row.vcs),
    )


class ReservationControl:
    """The part of `Manager` that makes and deletes reservations."""

    store: Store
    clock: Callable[[], float]
    lock: threading.RLock
    scheduler: SchedulerCore
    cluster: Cluster
    _dirty: bool
    _wake: threading.Event

    if TYPE_CHECKING:  # the manager's own

        def _changing(self) -> AbstractContextManager[None]: ...

    def _restore_reservations(self, scheduler: SchedulerCore) -> None:
        """Make every stored reservation in a core just built (one it cannot honour, HiveD's or
        ElasticFlow's, or whose nodes are gone, is left out)."""
        ids = gpu_ids_by_name(scheduler.cluster)
        for row in self.store.reservations():
            made = _core_reservation(row, ids)
            if made is None:
                continue
            try:
                scheduler.reserve(made)
            except ReservationError:
                continue

    def create_reservation(
        self,
        name: str,
        *,
        gpus: int | None,
        nodes: Sequence[str],
        start: float,
        duration: float,
        users: Sequence[str],
        vcs: Sequence[str],
        actor: str,
    ) -> dict[str, Any]:
        """Make a reservation (ControlError 409 for a name taken or GPUs another reservation
        claims then, 422 for anything else it cannot be made as)."""
        with self._changing():
            now = self.clock()
            if not name.strip():
                raise ControlError(422, "name: must not be empty")
            rows = self.store.reservations()
            if any(row.name == name for row in rows):
                raise ControlError(409, f"name: a reservation {name!r} exists already")
            if not duration > 0:
                raise ControlError(422, f"duration: must be positive, got {duration:g}")
            ids = gpu_ids_by_name(self.cluster)
            names = {gpu: gpu_name for gpu_name, gpu in ids.items()}
            end = start + duration
            taken = [
                ids[gpu_name]
                for row in rows
                if row.start < end and start < row.start + row.duration
                for gpu_name in row.gpus
                if gpu_name in ids
            ]
            busy_until: dict[int, float] = {}  # each busy GPU's latest end by time limits
            for job in self.scheduler.running_jobs():
                ends = now + job.limit_left_s(now)
                for gpu in job.placement:
                    busy_until[gpu] = max(ends, busy_until.get(gpu, ends))
            try:
                chosen = choose_gpus(
                    self.cluster,
                    gpus=gpus,
                    nodes=nodes,
                    taken=taken,
                    busy_until=busy_until,
                    start=start,
                )
            except ReservationError as error:
                if "reserved" in str(error):  # GPUs another reservation claims then
                    raise ControlError(409, str(error)) from None
                raise ControlError(422, str(error)) from None
            row = ReservationRow(
                name=name,
                start=start,
                duration=duration,
                gpus=tuple(names[gpu] for gpu in chosen),
                users=tuple(sorted(set(users))),
                vcs=tuple(sorted(set(vcs))),
                actor=actor,
                created_at=now,
            )
            made = _core_reservation(row, ids)
            assert made is not None
            try:
                self.scheduler.reserve(made)
            except ReservationError as error:
                raise ControlError(409, str(error)) from None
            try:
                self.store.add_reservation(row)
            except BaseException:
                self.scheduler.unreserve(name)
                raise
            self._dirty = True
        self._wake.set()
        return self.reservation_view(row, now)

    def delete_reservation(self, name: str) -> dict[str, Any]:
        """Delete a reservation (ControlError 404 if there is none of that name)."""
        with self._changing():
            now = self.clock()
            rows = {row.name: row for row in self.store.reservations()}
            if name not in rows:
                raise ControlError(404, f"no reservation {name!r}")
            self.store.delete_reservation(name)
            try:
                self.scheduler.unreserve(name)
            except ReservationError:
                pass  # its window was over (the core forgot it), or its nodes are gone
            self._dirty = True
        self._wake.set()
        return self.reservation_view(rows[name], now)

    def reservation_views(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [self.reservation_view(row, now) for row in self.store.reservations()]

    @staticmethod
    def reservation_view(row: ReservationRow, now: float) -> dict[str, Any]:
        end = row.start + row.duration
        state = "waiting" if now < row.start else "active" if now < end else "ended"
        return {
            "name": row.name,
            "start": row.start,
            "end": end,
            "duration": row.duration,
            "gpus": list(row.gpus),
            "gpu_count": len(row.gpus),
            "users": list(row.users),
            "vcs": list(row.vcs),
            "state": state,
            "by": row.actor,
            "summary": f"{count_noun(len(row.gpus), 'GPU')} for "
            + (", ".join([*row.users, *(f"VC {v}" for v in row.vcs)]) or "no one"),
        }


__all__ = ["ReservationControl"]
