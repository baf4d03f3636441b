"""The sorted indexes of the scheduler's jobs: the waiting queue and the running jobs, by key.

Each key is `(-level, *the policy's stored key, seq)`: a job's integer level first (higher
first), the policy's order breaking ties, and the job's seq last, naming the job (no two keys are
equal). A round walks the waiting queue from its front; preemption reads the running jobs from
their back (the lowest priority).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import TypeAlias

from sortedcontainers import SortedList

from corral.core.policy.base import Key

#: The waiting queue is a `FlatIndex` while it is short and a `SortedList` while it is long
#: (`Scheduler._enqueue`, `_dequeue`): a flat list moves every entry behind an insert, which
#: costs more than SortedList's layers from several thousand entries on (an insert and a remove,
#: pure Python: 1.7 us against 2.1 us at 2,000 entries, 3.8 against 3.1 at 8,000, 33 against 10
#: at 128,000; compiled, the flat list's bisects are C calls). The bounds are apart, so that a
#: queue at one does not switch at every job.
LONG_QUEUE = 8192
SHORT_QUEUE = 2048


class FlatIndex:
    """A sorted list of the scheduler's keys (each ending with its job's seq, `_index`) with
    SortedList's `add`, `remove` and bisects, for the running jobs and a short waiting queue: the
    running jobs are at most one per GPU (a few thousand), so one flat list moved by memmove
    beats SortedList's layers, and a re-key that leaves the job between its neighbours (most
    do: few running jobs share a key level) replaces it where it is (`replace`).

    The keys are a plain list (`keys`), not this object: `bisect` reads a list subclass's items
    through Python's generic item slot (a method lookup and a call per probe), 1.8 times as
    slow as a list's (550 ns against 984 ns a bisect of 730 keys)."""

    __slots__ = ("keys",)

    def __init__(self, keys: Iterable[Key] = ()) -> None:
        self.keys: list[Key] = list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, position: int) -> Key:
        return self.keys[position]

    def __iter__(self) -> Iterator[Key]:
        return iter(self.keys)

    def bisect_left(self, item: Key) -> int:
        return bisect.bisect_left(self.keys, item)

    def bisect_right(self, item: Key) -> int:
        return bisect.bisect_right(self.keys, item)

    def add(self, item: Key) -> None:
        bisect.insort(self.keys, item)

    def remove(self, item: Key) -> None:
        keys = self.keys
        index = bisect.bisect_left(keys, item)
        if index == len(keys) or keys[index] != item:
            raise ValueError(f"{item!r} not in the index")
        del keys[index]

    def replace(self, old: Key, new: Key) -> None:
        """`remove(old)` then `add(new)`, in place when `new` sorts where `old` was."""
        keys = self.keys
        index = bisect.bisect_left(keys, old)
        if index == len(keys) or keys[index] != old:
            raise ValueError(f"{old!r} not in the index")
        if (index == 0 or keys[index - 1] < new) and (
            index + 1 == len(keys) or new < keys[index + 1]
        ):
            keys[index] = new
            return
        del keys[index]
        bisect.insort(keys, new)


#: A waiting queue: flat while short, layered while long.
Index: TypeAlias = "SortedList | FlatIndex"
