"""Which jobs' processes hold each GPU, for a manager whose jobs may share GPUs.

Jobs share a GPU only under a mechanism configured to let them: a round stage that packs jobs
together (Gandiva's packing) or a placement that gives shares of a GPU (FGD). Only then does the
manager keep this index (`Manager.shares_gpus`); with neither, no GPU is ever shared, and nothing
of it runs in a round. It is kept as attempts start, stop and end, never rebuilt from the
attempts: it says which jobs share a GPU with a job (their throughput is measured under the shape
"sharing with the other's model"), which running jobs a new attempt shares its GPUs with, and
which jobs' partners may have changed since the manager last looked (`changed`).
"""

from __future__ import annotations

from collections.abc import Iterable


class GpuHolders:
    """GPU -> the attempts (job id, attempt number) whose processes hold it: the running ones and
    those still stopping."""

    def __init__(self) -> None:
        self._by_gpu: dict[int, dict[tuple[str, int], int]] = {}  # attempt -> when it was added
        self._attempts: dict[tuple[str, int], tuple[int, ...]] = {}
        self._numbers: dict[str, list[int]] = {}  # job id -> its attempts held here
        self._added = 0
        #: Jobs whose partners (the other jobs on their GPUs) may have changed since it was last
        #: emptied: every job an attempt was added for or taken off, and every job on its GPUs.
        self.changed: set[str] = set()
        #: GPUs more than one attempt holds now.
        self.shared = 0

    def add(self, job_id: str, number: int, gpus: Iterable[int]) -> None:
        """An attempt holds these GPUs (it started, or was found running or stopping)."""
        key = (job_id, number)
        if key in self._attempts:
            self.remove(job_id, number)
        held = self._attempts[key] = tuple(gpus)
        self._numbers.setdefault(job_id, []).append(number)
        self._added += 1
        self.changed.add(job_id)
        for gpu in held:
            on_gpu = self._by_gpu.setdefault(gpu, {})
            on_gpu[key] = self._added
            if len(on_gpu) > 1:
                self.shared += len(on_gpu) == 2
                self.changed.update(other for other, _ in on_gpu)

    def remove(self, job_id: str, number: int) -> None:
        """The attempt's processes are gone (it ended, or was dropped): its GPUs are not its."""
        key = (job_id, number)
        held = self._attempts.pop(key, None)
        if held is None:
            return
        numbers = self._numbers[job_id]
        numbers.remove(number)
        if not numbers:
            del self._numbers[job_id]
        self.changed.add(job_id)
        for gpu in held:
            on_gpu = self._by_gpu[gpu]
            del on_gpu[key]
            if not on_gpu:
                del self._by_gpu[gpu]
                continue
            self.shared -= len(on_gpu) == 1
            self.changed.update(other for other, _ in on_gpu)

    def touch(self, job_id: str) -> None:
        """Something of the job other than its GPUs changed (it left the core, or came back to
        it while its processes still stop): the jobs on its GPUs look at it again."""
        self.changed.add(job_id)
        for number in self._numbers.get(job_id, ()):
            for gpu in self._attempts[(job_id, number)]:
                self.changed.update(other for other, _ in self._by_gpu[gpu])

    def partners(self, job_id: str) -> set[str]:
        """The other jobs whose processes share a GPU with any of the job's attempts."""
        found: set[str] = set()
        for number in self._numbers.get(job_id, ()):
            for gpu in self._attempts[(job_id, number)]:
                on_gpu = self._by_gpu[gpu]
                if len(on_gpu) > 1:
                    found.update(other for other, _ in on_gpu)
        found.discard(job_id)
        return found

    def on(self, gpus: Iterable[int]) -> list[tuple[str, int]]:
        """The attempts holding any of these GPUs, in the order they were added."""
        found: dict[tuple[str, int], int] = {}
        for gpu in gpus:
            found.update(self._by_gpu.get(gpu, {}))
        return sorted(found, key=found.__getitem__)

    def take_changed(self) -> set[str]:
        """The jobs whose partners may have changed, forgotten as taken."""
        changed, self.changed = self.changed, set()
        return changed
