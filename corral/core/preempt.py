"""Preemption: which running jobs a waiting job that does not fit on free GPUs takes GPUs from.

The scheduler's round asks it twice for each waiting job: may the job preempt at all
(`Preemption.may_preempt_for`: the policy's order, or an admission that reclaims), and, once the
placement found no room on free GPUs, `Preemption.make_room`. Which running jobs give way is a
victim rule, chosen by name (`VICTIM_RULES`, the `victims` option): `lowest` (from the lowest
priority up, until the job fits) or `in-order` (the Tiresias simulator's pass). A rule frees its
victims' GPUs in a `Statement` while it asks the placement, and commits it (the victims the start
uses are preempted, the others keep their GPUs) or discards it.

What the search reads of the scheduler is declared by `PreemptHost`; the scheduler's own indexes
(its running jobs in key order, its jobs by seq, their stored keys) are given read-only.

Three fast paths keep preemption-heavy rounds cheap:

* a failed search is remembered (`no_room`) while nothing that could change it happens: a search
  that found no place without trying one fails again while, in every node and rack, the free GPUs
  plus those of the job's victims do not grow, and only a running job the job may not preempt
  that stops (`running_left`), or one whose key comes to follow the job's (`rekeyed`), makes them
  grow (GPUs freed by anything else, `Cluster.frees`, forget every search);
* in-order victims are read as one slice of the running index (`_candidates_in_order`);
* "may not preempt" is answered from a bound on the keys of the running jobs whose key changes
  are held back (`held_bound`, corral.core.timers), without taking those changes.

A running job that started less than `exempt_s` ago (since its last start) is no victim (Slurm's
PreemptExemptTime): an 8-GPU job LAS demotes is not stopped by every 1-GPU job that arrives.
Each start's exemption end is kept in a heap (`started`), so that the scheduler wakes when one
ends while a job waits (`next_exemption_end`) and does not repeat a quiet round across it
(`exemption_ended`); a search that passed over an exempt job is not remembered.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from corral.core.compiled import mypyc_attr
from corral.core.placement.base import Placed
from corral.core.policy.base import Key, Policy
from corral.core.reservations import place_held_out
from corral.core.statement import Statement

if TYPE_CHECKING:
    from corral.core.actions import Action
    from corral.core.chain import AdmissionChain
    from corral.core.cluster import Cluster
    from corral.core.job import Job
    from corral.core.placement.base import NotPlaced, Placement
    from corral.core.stages import Stage

# Placement attempts a waiting job may make while adding preemption victims one by one.
MAX_PREEMPTION_ATTEMPTS = 32
#: What a search for room returns.
Outcome = Literal["started", "too few victims", "no placement"]
#: A search for room for one waiting job: (job, now, actions) -> its outcome.
RoomMaker = Callable[["Job", float, "list[Action]"], Outcome]


def _nothing() -> None:
    pass


def _no_bound(now: float) -> Key | None:
    return None


class _Top:
    """Sorts after anything it is compared with (an upper bound for keys of one prefix)."""

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return True


TOP = _Top()


class PreemptHost(Protocol):
    """What preemption asks of the scheduler."""

    @property
    def cluster(self) -> Cluster: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def placement(self) -> Placement: ...

    def start_on(self, job: Job, placed: Placed, now: float, actions: list[Action]) -> None:
        """Start the waiting job on the GPUs placed (free in the cluster)."""
        ...

    def stop_freed(self, job: Job, by: Job, now: float, actions: list[Action]) -> None:
        """Preempt a running job whose GPUs a statement freed already, for `by`: stop it (with
        a partner it shared them with) and queue it again."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)
class VictimRule:
    """Which running jobs give way to a waiting job, and in which order they are tried."""

    name: ClassVar[str] = "base"
    summary: ClassVar[str] = ""
    #: It runs beside an admission that restricts or adds victims (`Admission.picks_victims`).
    with_picked_victims: ClassVar[bool] = True

    def make_room(self, search: Preemption, job: Job, now: float, actions: list[Action]) -> Outcome:
        raise NotImplementedError

    def bind(self, search: Preemption) -> RoomMaker:
        """Its `make_room` for one search object, as the round calls it (a rule may give one
        of the search's own methods, saving a call per search)."""

        def make_room(job: Job, now: float, actions: list[Action]) -> Outcome:
            return self.make_room(search, job, now, actions)

        return make_room

    def slices(self, search: Preemption) -> bool:
        """May the search read its victims as one slice of the running index?"""
        return False


class LowestFirst(VictimRule):
    name = "lowest"
    summary = "the lowest-priority running jobs first, until the job can be placed"

    def make_room(self, search: Preemption, job: Job, now: float, actions: list[Action]) -> Outcome:
        return search.lowest_first(job, now, actions)

    def bind(self, search: Preemption) -> RoomMaker:
        return search.lowest_first


class InOrder(VictimRule):
    name = "in-order"
    summary = (
        "the Tiresias simulator's pass: from the highest priority down, each running job keeps "
        "its GPUs while it fits in what the job leaves"
    )
    with_picked_victims = False

    def make_room(self, search: Preemption, job: Job, now: float, actions: list[Action]) -> Outcome:
        if not job.spec.plain:  # a share, CPU or memory: counted GPUs are no bound
            return search.lowest_first(job, now, actions)
        return search.in_order(job, now, actions)

    def slices(self, search: Preemption) -> bool:
        policy = search.policy
        return (
            policy.preemptive
            and policy.stored_is_key
            and type(policy).preempts is Policy.preempts
            and not search.admission.picks_victims
            and not search.shared
        )


#: The victim rules, by name (the `victims` option).
VICTIM_RULES: dict[str, type[VictimRule]] = {"lowest": LowestFirst, "in-order": InOrder}


class Preemption:
    """The preemption of one scheduler: its victim rule, its searches and what they remember."""

    def __init__(
        self,
        host: PreemptHost,
        rule: VictimRule,
        admission: AdmissionChain,
        *,
        running: list[Key],
        by_seq: dict[int, Job],
        stored: dict[int, Key],
        shared: Sequence[Stage],
        remembers: bool,
        exempt_s: float = 0.0,
    ) -> None:
        """`running`: the running jobs' keys in order (the scheduler's flat index, read only);
        `by_seq`, `stored`: its jobs and their stored keys by seq; `shared`: the stages under
        which jobs share GPUs (a victim's GPUs may stay taken by its partner); `remembers`:
        failed searches may be remembered (keys fixed between announced instants and a
        placement that depends on the free GPUs alone, under the base victim rule);
        `exempt_s`: a running job is no victim until it has run this long since its last
        start (0: from the next instant on)."""
        self.host = host
        self.cluster = host.cluster
        self.policy = host.policy
        self.placement = host.placement
        self.rule = rule
        self.admission = admission
        self._running = running
        self._by_seq = by_seq
        self._stored = stored
        self.shared = list(shared)
        self._picks = admission.picks_victims
        self.remembers = remembers and type(host.policy).preempts is Policy.preempts
        #: Who may preempt whom follows from stored keys, by the base rule (whose answer a
        #: higher victim key never turns from yes to no): a bound on the keys may answer.
        self._bounded = self.policy.stored_is_key and type(host.policy).preempts is Policy.preempts
        self.slices = rule.slices(self)
        #: The victims are one slice of the running index, and nothing but their start, type
        #: and exemption passes any over (`_candidates_sliced`): the victim rules' conditions of
        #: `InOrder.slices`.
        self.sliceable = InOrder().slices(self)
        #: Preempt running jobs, by the victim rule, until the job can be placed. Returns
        #: "started", "too few victims" (those it may preempt hold too few GPUs), or "no
        #: placement" (they hold enough, but freeing them gives no placement the rules accept).
        self.make_room: RoomMaker = rule.bind(self)
        #: A placement was tried (and failed) while preempting, since the scheduler last reset it.
        self.tried = False
        #: GPUs the job being made room for may not take, even once its victims free them
        #: (reserved for others: corral.core.reservations); set by the walk for one search.
        self.held_out: frozenset[int] = frozenset()
        #: Running job's seq -> GPUs it holds per node, and per rack (`_held_in`).
        self._held_by_node: dict[int, tuple[tuple[int, int], ...]] = {}
        self._held_by_rack: dict[int, tuple[tuple[int, int], ...]] = {}
        #: Waiting jobs whose search found no place without trying one, by seq: (the
        #: placement's scope then, the outcome); `no_room_keys`: those jobs' keys in order, so
        #: that each event forgets the searches it may change (`_forget`).
        self.no_room: dict[int, tuple[str, Outcome]] = {}
        self.no_room_keys: list[Key] = []
        #: `Cluster.frees` as this scheduler's own frees left it: when the cluster says more,
        #: GPUs came back by no event that forgets searches (a node back online, a migration,
        #: another scheduler on the same cluster: HiveD's VCs on the cluster of its opportunistic
        #: jobs), so every failed search is forgotten.
        self._frees_seen = self.cluster.frees
        self._skipped_new = False  # `_candidates` passed over a job started at that instant
        #: (start + exempt_s, seq, start) of each start (`started`); stale ones are dropped.
        self.exempt_s = exempt_s
        self._exemptions: list[tuple[float, int, float]] = []
        #: Takes the running jobs' key changes held back (corral.core.timers) before the running
        #: index is read; set by the scheduler.
        self.settle: Callable[[], None] = _nothing
        #: A key at or after which the keys those held changes give sort (`Timers.held_bound`;
        #: None: none known); set by the scheduler.
        self.held_bound: Callable[[float], Key | None] = _no_bound

    # -- what the scheduler tells it ------------------------------------------------------------

    def started(self, job: Job, now: float) -> None:
        """A job started (or was found running): exempt until `exempt_s` after its start (a
        start hook, added only when `exempt_s` > 0)."""
        start = job.run_started_at
        if start is not None:
            heapq.heappush(self._exemptions, (start + self.exempt_s, job.seq, start))

    def _drop_stale(self) -> None:
        heap = self._exemptions
        by_seq = self._by_seq
        while heap:
            _, seq, start = heap[0]
            job = by_seq.get(seq)
            if job is not None and job.run_started_at == start:
                return
            heapq.heappop(heap)  # it stopped (or started again: a later entry)

    def exemption_ended(self, now: float) -> bool:
        """A running job's exemption ended since the last `next_exemption_end` (by `now`)."""
        self._drop_stale()
        return bool(self._exemptions) and self._exemptions[0][0] <= now

    def next_exemption_end(self, now: float) -> float:
        """The earliest instant after `now` a running job stops being exempt (inf: none); the
        ends up to `now` are taken (the round at `now` saw them)."""
        heap = self._exemptions
        while True:
            self._drop_stale()
            if not heap or heap[0][0] > now:
                return heap[0][0] if heap else math.inf
            heapq.heappop(heap)

    def exempt(self, victim: Job, now: float) -> bool:
        """The running job is no victim at `now`: it started at this instant, or less than
        `exempt_s` ago."""
        start = victim.run_started_at
        return start == now or (start is not None and now - start < self.exempt_s)

    def running_left(self, job: Job, key: Key) -> None:
        """A running job of this key left the running index (it stopped: its GPUs are free,
        for the jobs that may not preempt it)."""
        if self.no_room:
            self._frees_seen += 1  # its own free: forgets what it may change, no more
            self._forget(key, None)
        if self._held_by_node:
            self._held_by_node.pop(job.seq, None)
        if self._held_by_rack:
            self._held_by_rack.pop(job.seq, None)

    def waiting_left(self, job: Job, key: Key) -> None:
        """A waiting job of this key left the queue."""
        if self.no_room.pop(job.seq, None) is not None:
            self.no_room_keys.remove(key)

    def rekeyed(self, old: Key, new: Key) -> None:
        """A running job's key changed: the waiting jobs that may now preempt it, and could not
        before, search again."""
        if self.no_room:
            self._forget(old, new)

    def _forget(self, low: Key, high: Key | None) -> None:
        """Forget the failed searches of the waiting jobs that may not preempt a running job of
        key `low` but may preempt one of key `high` (None: the jobs that may not preempt `low`):
        by `Policy.preempts`, those of keys from `low` up to before `high`, compared by their
        leading `preempt_prefix` parts."""
        cut = self.policy.preempt_prefix
        keys = self.no_room_keys
        start = bisect.bisect_left(keys, low if cut is None else low[:cut])
        end = len(keys)
        if high is not None:
            end = bisect.bisect_left(keys, high if cut is None else high[:cut])
        if start < end:
            for key in keys[start:end]:
                del self.no_room[key[-1]]
            del keys[start:end]

    # -- who may preempt whom -------------------------------------------------------------------

    def current_key(self, job: Job, now: float) -> Key:
        if self.policy.stored_is_key:
            return self._stored[job.seq]
        return (-job.spec.level, *self.policy.key(job, now), job.seq)

    def may_preempt_for(self, job: Job, now: float) -> bool:
        if self._picks and self.admission.can_reclaim(job):
            return True
        running = self._running
        if not self.policy.preemptive or not running:
            return False
        bound = self.held_bound(now)
        if bound is not None and self._bounded:
            # Every running key, once the held changes are taken, sorts at or before the higher
            # of the bound and the highest key held now (a held job's own, or another's that
            # stays): if the job may not preempt that, it may preempt none.
            lowest_key = running[-1]
            if not self.policy.preempts(
                self._stored[job.seq], bound if bound > lowest_key else lowest_key
            ):
                return False
        self.settle()
        lowest = self._by_seq[running[-1][-1]]
        return self.policy.preempts(self.current_key(job, now), self.current_key(lowest, now))

    def _victims(self, job: Job, now: float) -> Iterator[Job]:
        """Running jobs the job may preempt, the ones to give way first first: GPUs other VCs
        borrowed (a quota reclaiming them), then jobs of lower priority, the lowest first."""
        admission = self.admission
        picks = self._picks
        job_key = self.current_key(job, now)
        offered: set[str] = set()
        by_seq = self._by_seq
        if picks and admission.can_reclaim(job):
            lowest_first = (by_seq[key[-1]] for key in reversed(self._running))
            for victim in admission.reclaim(job, lowest_first):
                offered.add(victim.id)
                yield victim
        if not self.policy.preemptive:
            return
        # The running index is not changed while the caller looks at victims (it only frees and
        # takes back their GPUs), so it is walked by an iterator, not by position.
        stored = self.policy.stored_is_key
        for key in reversed(self._running):
            victim = by_seq[key[-1]]
            if not self.policy.preempts(job_key, key if stored else self.current_key(victim, now)):
                return
            if victim.id in offered:
                continue
            if picks and not admission.may_preempt(victim, job):
                continue
            yield victim

    def _candidates(self, job: Job, now: float) -> Iterator[Job]:
        """The job's victims (`_victims`, the lowest first) whose GPUs it could use. The first two
        filters stand in `_candidates_in_order` too, written out there to keep its loop tight."""
        half_pairs: dict[str, Job] = {}
        exempt_s = self.exempt_s
        for victim in self._victims(job, now):
            if victim.run_started_at == now:
                self._skipped_new = True  # one of its victims from the next instant on
                continue  # never undo a start of this same instant: no preemption cycles
            if exempt_s and self.exempt(victim, now):
                self._skipped_new = True  # one of its victims once its exemption ends
                continue
            if (
                job.spec.gpu_types is not None
                and victim.placement
                and not job.spec.accepts(self.cluster.gpus[victim.placement[0]].gpu_type)
            ):
                continue
            if not all(stage.frees_gpus(victim, half_pairs) for stage in self.shared):
                continue  # its GPUs stay taken by its partner unless that is a victim too
            yield victim

    def _victims_from(self, job: Job) -> int:
        """Where the job's victims begin in the running index, under the base victim rule
        (`Policy.preempts`): the running jobs whose keys, or their leading `preempt_prefix`
        parts, sort after its own."""
        job_key = self._stored[job.seq]
        cut = self.policy.preempt_prefix
        if cut is None:
            return bisect.bisect_right(self._running, job_key)
        # every key of a prefix sorts before the prefix extended by TOP
        return bisect.bisect_left(self._running, (*job_key[:cut], TOP))

    def _candidates_sliced(self, job: Job, now: float) -> Iterator[Job]:
        """`_candidates`, the lowest first, read from one slice of the running index (`sliceable`:
        no admission picks victims and no job shares GPUs, so only `_candidates`'s first three
        filters apply). The index does not change while the search reads it."""
        keys = self._running
        start = self._victims_from(job)
        by_seq = self._by_seq
        types = job.spec.gpu_types
        gpus = self.cluster.gpus
        exempt_s = self.exempt_s
        for position in range(len(keys) - 1, start - 1, -1):
            victim = by_seq[keys[position][-1]]
            if victim.run_started_at == now:
                self._skipped_new = True  # one of its victims from the next instant on
                continue  # never undo a start of this same instant: no preemption cycles
            if exempt_s and self.exempt(victim, now):
                self._skipped_new = True  # one of its victims once its exemption ends
                continue
            if types is not None and victim.placement:
                if not job.spec.accepts(gpus[victim.placement[0]].gpu_type):
                    continue
            yield victim

    def _candidates_in_order(self, job: Job, now: float) -> list[Job]:
        """`_candidates`, the highest priority first, read as one slice of the running index:
        under the base victim rule (`Policy.preempts`) the running jobs the job may preempt are
        those whose keys, or their leading `preempt_prefix` parts, sort after its own. The
        filters are `_candidates`'s (going through it took back half of the gain)."""
        keys = self._running
        start = self._victims_from(job)
        by_seq = self._by_seq
        types = job.spec.gpu_types
        gpus = self.cluster.gpus
        ordered = []
        exempt_s = self.exempt_s
        for key in keys[start:]:
            victim = by_seq[key[-1]]
            if victim.run_started_at == now:
                continue  # never undo a start of this same instant: no preemption cycles
            if exempt_s and self.exempt(victim, now):
                continue
            if types is not None and victim.placement:
                if not job.spec.accepts(gpus[victim.placement[0]].gpu_type):
                    continue
            ordered.append(victim)
        return ordered

    # -- making room ----------------------------------------------------------------------------

    def lowest_first(self, job: Job, now: float, actions: list[Action]) -> Outcome:
        """Preempt the lowest-priority running jobs, fewest first, until the job can be placed."""
        need = job.spec.gpus
        plain = job.spec.plain  # else a share, CPU or memory: free whole GPUs are no bound
        cluster = self.cluster
        scope = self.placement.scope(cluster, job, now)
        if self.no_room:
            if cluster.frees != self._frees_seen:  # not only this scheduler's: forget them all
                self.no_room.clear()
                self.no_room_keys.clear()
            known = self.no_room.get(job.seq)
            if known is not None and known[0] == scope:
                return known[1]
        self._skipped_new = False
        total = cluster.free_for(job.spec.gpu_types)
        freed_in: dict[int, int] = {}  # node or rack -> GPUs the victims so far would free there
        victims: list[Job] = []
        statement = Statement(cluster)
        attempts = 0
        candidates = (
            self._candidates_sliced(job, now) if self.sliceable else self._candidates(job, now)
        )
        # The first placement may be tried with only the victims in places with room freed
        # (not where victims share GPUs with partners: a stage's pairs are freed together).
        confined = (
            plain
            and scope != "cluster"
            and self.placement.confined
            and len(cluster.gpu_types) == 1
            and not self.held_out
            and not self.shared
        )
        # Each victim's GPUs per node or rack (`_held_in`, kept), and those places' free GPUs.
        held_by = self._held_by_node if scope == "node" else self._held_by_rack
        places = cluster.nodes if scope == "node" else cluster.racks
        for victim in candidates:
            victims.append(victim)
            total += victim.spec.gpus
            if plain:
                # Every victim's GPUs count towards its places, also before there are enough;
                # is there now a place with enough?
                if scope == "cluster":
                    room = True
                else:
                    room = False
                    held = held_by.get(victim.seq)
                    if held is None:
                        held = self._held_in(victim, scope)
                    for place, count in held:
                        freed = freed_in.get(place, 0) + count
                        freed_in[place] = freed
                        if places[place].free_gpus + freed >= need:
                            room = True
                if total < need or not room:
                    continue
            if confined and not attempts:  # (else asked again below with every victim freed)
                if self._start_confined(job, now, actions, scope, freed_in, victims, statement):
                    self._frees_seen = cluster.frees
                    return "started"
            statement.free_each(victims[len(statement.freed) :])
            result = self._place(job, now)
            attempts += 1
            if isinstance(result, Placed):
                self._start_in_room(job, result, statement, now, actions)
                self._frees_seen = cluster.frees
                return "started"
            if attempts >= MAX_PREEMPTION_ATTEMPTS:
                break
        self.tried = self.tried or attempts > 0
        statement.discard()
        self._frees_seen = cluster.frees
        outcome: Outcome = "no placement" if total >= need or not plain else "too few victims"
        if not attempts and plain and self.remembers and not self._skipped_new:
            if job.seq not in self.no_room:  # else one of another scope (the key is the same)
                bisect.insort(self.no_room_keys, self._stored[job.seq])
            self.no_room[job.seq] = (scope, outcome)
        return outcome

    def in_order(self, job: Job, now: float, actions: list[Action]) -> Outcome:
        """The Tiresias simulator's pass, for one waiting job: the running jobs it may preempt,
        from the highest priority down, keep their GPUs while they fit in the GPUs the job leaves
        (counted, not placed); the others give way, a large one before smaller ones below it.
        With a placement that counts GPUs (`any`) each of them is needed: what is left over is
        less than any of them holds."""
        cluster = self.cluster
        if self.slices:
            ordered = self._candidates_in_order(job, now)
        else:
            ordered = list(self._candidates(job, now))
            ordered.reverse()  # the highest priority first
        left = (
            cluster.free_for(job.spec.gpu_types)
            + sum(victim.spec.gpus for victim in ordered)
            - job.spec.gpus
        )
        if left < 0:
            return "too few victims"
        statement = Statement(cluster)
        freed = []
        for victim in ordered:
            if victim.spec.gpus <= left:
                left -= victim.spec.gpus
            else:
                freed.append(victim)
        statement.free_each(freed)
        self.tried = True
        result = self._place(job, now)
        if isinstance(result, Placed):
            self._start_in_room(job, result, statement, now, actions)
            return "started"
        statement.discard()
        return "no placement"

    def _start_confined(
        self,
        job: Job,
        now: float,
        actions: list[Action],
        scope: str,
        freed_in: dict[int, int],
        victims: list[Job],
        statement: Statement,
    ) -> bool:
        """The search's first placement, for a job whose placement is `confined` to a node or
        rack (`scope`) with room: it goes to a place where the free GPUs and those of the
        victims there (`freed_in`) are enough, and those places' state alone decides which, so
        only the victims with GPUs in them are freed to ask it. If it places the job, the job
        starts as if every victim had been freed: the statement takes back the others' GPUs
        as it takes back those of the victims the start does not use (`commit_among`), which
        leaves the cluster as freeing them all would have. If not, the frees are undone and
        the caller asks again with every victim freed: each node the undone frees moved in its
        bucket is moved again by those frees, so the buckets end as if the first try had never
        been. Returns whether the job started."""
        cluster = self.cluster
        need = job.spec.gpus
        places = cluster.nodes if scope == "node" else cluster.racks
        rooms = {
            place for place, freed in freed_in.items() if places[place].free_gpus + freed >= need
        }
        chosen: list[Job] = []
        held_by = self._held_by_node if scope == "node" else self._held_by_rack
        for victim in victims:
            if not victim.spec.plain:
                return False
            held = held_by.get(victim.seq)
            if held is None:
                held = self._held_in(victim, scope)
            for place, _ in held:
                if place in rooms:
                    chosen.append(victim)
                    break
        statement.free_each(chosen)
        result = self._place(job, now)
        if isinstance(result, Placed):
            self._start_in_room(job, result, statement, now, actions, victims)
            return True
        statement.discard()
        return False

    def _place(self, job: Job, now: float) -> Placed | NotPlaced:
        if self.held_out:
            return place_held_out(self.cluster, self.placement, job, now, self.held_out)
        return self.placement.place(self.cluster, job, now)

    def _start_in_room(
        self,
        job: Job,
        result: Placed,
        statement: Statement,
        now: float,
        actions: list[Action],
        among: list[Job] | None = None,
    ) -> None:
        """Start the job where the placement put it: the victims it uses are preempted, the
        others take their GPUs again (not needed after all). `among`: the search's victims,
        of which the statement freed some (`_start_confined`)."""
        chosen = set(result.gpus)

        def used(victim: Job) -> bool:
            return not chosen.isdisjoint(victim.placement) or (
                result.node >= 0 and victim.node == result.node
            )

        def stop(victim: Job) -> None:
            self.host.stop_freed(victim, job, now, actions)

        if among is None:
            statement.commit(used, stop)
        else:
            statement.commit_among(among, used, stop)
        self.host.start_on(job, result, now, actions)

    def _held_in(self, job: Job, scope: str) -> tuple[tuple[int, int], ...]:
        """How many GPUs the running job holds in each node ("node") or rack ("rack"), kept
        until it stops: a job is looked at as a victim in round after round."""
        by_seq = self._held_by_node if scope == "node" else self._held_by_rack
        cached = by_seq.get(job.seq)
        if cached is not None:
            return cached
        cluster = self.cluster
        counts: dict[int, int] = {}
        for gpu in job.placement:
            node = cluster.gpu_node[gpu]
            place = node if scope == "node" else cluster.node_rack[node]
            counts[place] = counts.get(place, 0) + 1
        held = tuple(counts.items())
        by_seq[job.seq] = held
        return held
