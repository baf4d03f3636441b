"""A real Prometheus scrapes a live `corral up` every second; every query of the Grafana dashboard
(its variables substituted) and every alert rule's expression is asked of Prometheus at known
moments, and must read the counts worked out by hand below.

The cluster: TWO_VCS (one machine of 2 GPUs; VCs a and b guaranteed one each). Users: alice
(token bound to a, made before Prometheus starts), bob (bound to b, made after its first scrape)
and the admin (bound to none: both VCs). The story, and the moments the queries are asked at:

- T0: nothing submitted yet.
- bob's `ok` succeeds; bob's `bad` exits 3 twice (max_retries 1: one retry, then FAILED).
  alice's `anchor` runs on a's GPU, bob's `trainer` (examples/train.py, reporting progress) on
  b's; alice then submits three jobs that wait (no free GPU, and neither running job may be
  preempted: each runs within its VC's guarantee).
- T1: the three wait.
- The three are cancelled (they never started).
- T2: the main check.
- `anchor` and `trainer` are cancelled.
- T3: nothing runs; the per-job gauges are gone.

Each moment is the timestamp of a scrape that began after the story reached it (and a second
more); every query is evaluated exactly there. Prometheus extrapolates `increase()` and `rate()`
towards the window's ends; with every counter scraped at 0 before its first event and the query
evaluated at the latest sample, there is nothing to extrapolate (towards the start: a counter's
extrapolation stops where it would fall below 0, here at its first sample, 0; towards the end:
the latest sample is the window's end), so `increase()` reads exactly what happened and `rate()`
that over the window's 300 s: the asserts allow for floating point only. A counter whose series
appeared only at its first event (no zero series) would lose that event: `increase()` over three
cancels read 0 (all three between two scrapes) or less than 3.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml

from corral.server.metrics import FAILURE_CAUSES, FINAL_STATUSES, QUEUEING_BUCKETS
from tests.server.helpers import (
    REPO,
    TWO_VCS,
    Corral,
    api,
    considered,
    job,
    kill_jobs_of,
    python_job,
    submit,
    train_job,
    wait_for,
    wait_until,
)
from tests.server.prometheus import Prometheus

DEPLOY = REPO / "deploy"
SCRAPE_JOB = "corral"
SLEEPER = "import time; time.sleep(600)"
VCS = ("a", "b")
#: The window of the dashboard's rates ([5m]): every event must lie within it at T1 and T2.
RATE_WINDOW_S = 300.0
#: Users with a series from the start: (VC, user) of the live tokens.
OWNERS = (("a", "admin"), ("b", "admin"), ("a", "alice"), ("b", "bob"))
STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")


@dataclass
class Moment:
    """What is true at one moment, worked out by hand from the story: per VC (and user, cause,
    status) since the manager started."""

    at: float = 0.0
    pending: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)  # = GPUs allocated (1 GPU each)
    submitted: dict[tuple[str, str], int] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    finished: dict[tuple[str, str, str], int] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)
    #: The queueing seconds observed (each job's first start), per VC.
    waits: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Live:
    prometheus: Prometheus
    instance: str
    moments: dict[str, Moment]
    trainer: str


def waited(found: dict[str, Any]) -> float:
    return float(found["started_at"] - found["submitted_at"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("prometheus-live")
    data_dir = home / "corral"
    data_dir.mkdir()
    cluster = home / "cluster.yaml"
    cluster.write_text(TWO_VCS)
    up = Corral(data_dir, "--config", str(cluster))
    prometheus: Prometheus | None = None
    try:
        admin = up.start()

        def token(user: str, vc: str) -> httpx.Client:
            made = admin.post("/api/v1/tokens", json={"user": user, "vc": vc})
            assert made.status_code == 201, made.text
            return api(up.url, made.json()["token"])

        alice = token("alice", "a")
        # The shipped scrape config (its authorization with the metrics token beside it, its
        # rules), scraping this manager every second, rules evaluated every second.
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        (scrape,) = config["scrape_configs"]
        assert scrape["job_name"] == SCRAPE_JOB
        scrape["static_configs"] = [{"targets": [f"127.0.0.1:{up.port}"]}]
        where = home / "prometheus"
        where.mkdir()
        shutil.copy(DEPLOY / "prometheus" / "alerts.yaml", where / "alerts.yaml")
        shutil.copy(data_dir / "metrics.token", where / scrape["authorization"]["credentials_file"])
        prometheus = Prometheus(where, config).start()
        first = prometheus.scraped_after(SCRAPE_JOB, 0.0)
        bob = token("bob", "b")  # made while Prometheus scrapes: its series start at 0 now
        moments = {}
        # T0: after bob's token, and after a scheduling round since the first scrape (a rate
        # needs two samples in its window; the round time's, a round between them: one runs at
        # least every 5 s, later on a busy machine).
        rounds = "corral_scheduling_round_seconds_count"

        def count_of_rounds(server: Prometheus, at: float | None = None) -> float:
            (series,) = server.query(rounds, at=at)
            return float(series["value"][1])

        before = count_of_rounds(prometheus, first)
        server = prometheus
        server.wait(lambda: count_of_rounds(server) > before, "a round after the first scrape")
        zero = Moment(jobs=dict.fromkeys(STATES, 0))
        zero.at = prometheus.scraped_after(SCRAPE_JOB, time.time() + 1.0)
        moments["T0"] = zero
        began = time.time()

        ok = submit(bob, **python_job("ok", "pass"))
        assert wait_for(bob, ok)["status"] == "SUCCEEDED"
        bad = submit(bob, **python_job("bad", "import sys; sys.exit(3)", max_retries=1))
        failed = wait_for(bob, bad)
        assert failed["status"] == "FAILED" and failed["attempts"] == 2, failed
        anchor = submit(alice, **python_job("anchor", SLEEPER, grace_seconds=2))
        wait_for(alice, anchor, ["RUNNING"])
        trainer = submit(bob, **train_job("trainer", steps=100_000, step_s=0.05))
        wait_for(bob, trainer, ["RUNNING"])
        wait_until(
            lambda: (job(bob, trainer)["progress"] or {}).get("steps_per_s"),
            "the trainer's rate of steps",
        )
        waiting = [submit(alice, **python_job(f"waits-{i}", SLEEPER)) for i in range(3)]
        for job_id in waiting:
            assert considered(alice, job_id)["attempts"] == 0
        jobs = {j: job(admin, j) for j in (ok, bad, anchor, trainer)}
        waits = {
            "a": [waited(jobs[anchor])],
            "b": [waited(jobs[j]) for j in (ok, bad, trainer)],
        }
        assert jobs[anchor]["preemptions"] == jobs[trainer]["preemptions"] == 0
        # By hand: submitted alice 4 (anchor, three waiting), bob 3; attempts started: a 1
        # (anchor), b 4 (ok, bad twice, trainer); bad's two failures (cause user), one retry;
        # finished: ok SUCCEEDED, bad FAILED; running anchor (a) and trainer (b).
        one = Moment(
            pending={"a": 3, "b": 0},
            running={"a": 1, "b": 1},
            submitted={("a", "alice"): 4, ("b", "bob"): 3},
            started={"a": 1, "b": 4},
            failures={("b", "user"): 2},
            retries={"b": 1},
            finished={("b", "bob", "SUCCEEDED"): 1, ("b", "bob", "FAILED"): 1},
            jobs=dict.fromkeys(STATES, 0)
            | {"PENDING": 3, "RUNNING": 2, "SUCCEEDED": 1}
            | {"FAILED": 1},
            waits=waits,
        )
        one.at = prometheus.scraped_after(SCRAPE_JOB, time.time() + 1.0)
        moments["T1"] = one

        for job_id in waiting:
            assert alice.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
        for job_id in waiting:
            assert wait_for(alice, job_id)["status"] == "CANCELLED"
        # T2: the three waiting jobs cancelled (never started): 3 more CANCELLED of alice's.
        two = Moment(
            pending={"a": 0, "b": 0},
            running=one.running,
            submitted=one.submitted,
            started=one.started,
            failures=one.failures,
            retries=one.retries,
            finished=one.finished | {("a", "alice", "CANCELLED"): 3},
            jobs=one.jobs | {"PENDING": 0, "CANCELLED": 3},
            waits=waits,
        )
        two.at = prometheus.scraped_after(SCRAPE_JOB, time.time() + 1.0)
        moments["T2"] = two
        if two.at - began > RATE_WINDOW_S - 10:
            pytest.fail(f"the story took {two.at - began:.0f} s: more than the panels' [5m]")

        for job_id in (anchor, trainer):
            assert admin.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
        for job_id in (anchor, trainer):
            assert wait_for(admin, job_id)["status"] == "CANCELLED"
        wait_until(
            lambda: all(
                a["state"] == "ended"
                for j in (anchor, trainer)
                for a in job(admin, j)["attempt_history"]
            ),
            "the cancelled jobs' attempts ended",
        )
        three = Moment(
            pending=two.pending,
            running={"a": 0, "b": 0},
            submitted=two.submitted,
            started=two.started,
            failures=two.failures,
            retries=two.retries,
            finished=two.finished | {("a", "alice", "CANCELLED"): 4, ("b", "bob", "CANCELLED"): 1},
            jobs=two.jobs | {"RUNNING": 0, "CANCELLED": 5},
            waits=waits,
        )
        three.at = prometheus.scraped_after(SCRAPE_JOB, time.time() + 1.0)
        moments["T3"] = three
        yield Live(prometheus, f"127.0.0.1:{up.port}", moments, trainer)
    finally:
        if prometheus is not None:
            prometheus.stop()
        up.stop()
        kill_jobs_of(data_dir)


# -- what a query returns ----------------------------------------------------------------------


def normalised(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    """A vector by its labels, less the ones Prometheus adds (job, instance) and the name."""
    found = {}
    for series in result:
        labels = {
            k: v for k, v in series["metric"].items() if k not in ("__name__", "job", "instance")
        }
        found[tuple(sorted(labels.items()))] = float(series["value"][1])
    return found


def by(name: str, values: dict[str, float]) -> dict[tuple[tuple[str, str], ...], float]:
    return {((name, key),): value for key, value in values.items()}


def scalar(value: float) -> dict[tuple[tuple[str, str], ...], float]:
    return {(): value}


def same(found: dict[Any, float], expected: dict[Any, float]) -> bool:
    if set(found) != set(expected):
        return False
    for key, value in expected.items():
        if math.isnan(value):
            if not math.isnan(found[key]):
                return False
        elif found[key] != pytest.approx(value, rel=1e-9, abs=1e-12):
            return False
    return True


def quantile(q: float, observed: list[float]) -> float:
    """What `histogram_quantile(q, ...)` answers for these observations in QUEUEING_BUCKETS
    (any rate() of the buckets scales every count alike, which does not change it): the rank
    q * n falls in the first bucket whose cumulative count reaches it; the answer lies in that
    bucket, linearly between its lower bound (0 for the first) and its upper bound, as far as the
    rank is into the bucket's count. NaN without observations."""
    if not observed:
        return math.nan
    rank = q * len(observed)
    below = 0
    lower = 0.0
    for upper in QUEUEING_BUCKETS:
        inside = sum(1 for w in observed if lower < w <= upper)
        if below + inside >= rank:
            return lower + (upper - lower) * (rank - below) / inside
        below += inside
        lower = upper
    return QUEUEING_BUCKETS[-1]  # in +Inf's bucket: the largest finite bound


# -- the dashboard -------------------------------------------------------------------------------

Expected = dict[tuple[tuple[str, str], ...], float] | Callable[[dict[Any, float]], bool]


def between(low: float, high: float) -> Callable[[dict[Any, float]], bool]:
    """One series (no labels) whose value lies in [low, high]: what is known of a duration."""
    return lambda found: len(found) == 1 and all(low <= v <= high for v in found.values())


def panel_expectations(m: Moment, vcs: tuple[str, ...]) -> dict[tuple[str, str], Expected]:
    """Each dashboard target's answer (title, refId) at moment `m` with the VCs `vcs` chosen."""
    r = RATE_WINDOW_S
    running = sum(m.running.get(vc, 0) for vc in vcs)
    users = {user for vc, user in OWNERS if vc in vcs}
    return {
        ("GPUs allocated", "A"): scalar(running / 2),
        ("GPUs offline", "A"): scalar(0),
        ("Jobs pending", "A"): scalar(sum(m.pending.get(vc, 0) for vc in vcs)),
        ("Jobs running", "A"): scalar(running),
        ("Jobs pending by VC", "A"): by("vc", {vc: m.pending.get(vc, 0) for vc in vcs}),
        ("Jobs running by VC", "A"): by("vc", {vc: m.running.get(vc, 0) for vc in vcs}),
        ("GPU utilisation (allocated / total)", "A"): scalar(running / 2),
        ("GPU utilisation (allocated / total)", "B"): scalar(0),
        ("GPUs allocated by VC (and guaranteed)", "A"): by(
            "vc", {vc: m.running.get(vc, 0) for vc in vcs}
        ),
        ("GPUs allocated by VC (and guaranteed)", "B"): by("vc", dict.fromkeys(vcs, 1)),
        ("Queueing time (submission to first start)", "A"): by(
            "vc", {vc: quantile(0.5, m.waits.get(vc, [])) for vc in vcs}
        ),
        ("Queueing time (submission to first start)", "B"): by(
            "vc", {vc: quantile(0.95, m.waits.get(vc, [])) for vc in vcs}
        ),
        ("Submissions, starts, preemptions, failures", "A"): scalar(
            sum(n for (vc, _), n in m.submitted.items() if vc in vcs) / r
        ),
        ("Submissions, starts, preemptions, failures", "B"): scalar(
            sum(m.started.get(vc, 0) for vc in vcs) / r
        ),
        ("Submissions, starts, preemptions, failures", "C"): scalar(0),
        ("Submissions, starts, preemptions, failures", "D"): by(
            "cause",
            {
                cause: sum(m.failures.get((vc, cause), 0) for vc in vcs) / r
                for cause in FAILURE_CAUSES
            },
        ),
        ("Submissions, starts, preemptions, failures", "E"): scalar(
            sum(m.retries.get(vc, 0) for vc in vcs) / r
        ),
        ("Jobs finished by status", "A"): by(
            "status",
            {
                status: sum(n for (vc, _, s), n in m.finished.items() if vc in vcs and s == status)
                / r
                for status in FINAL_STATUSES
            },
        ),
        ("Submissions by user", "A"): by(
            "user",
            {
                user: sum(n for (vc, u), n in m.submitted.items() if vc in vcs and u == user) / r
                for user in users
            },
        ),
        # Durations known only within bounds: a round takes more than 0 s and (on any machine
        # that passes these tests) less than 10 s, the largest bucket.
        ("Scheduling round time", "A"): between(1e-9, 10.0),
        ("Scheduling round time", "B"): between(1e-9, 10.0),
        ("Scheduling round time", "C"): between(1e-9, 10.0),
        # The manager's process: some CPU, between 10 MiB and 16 GiB resident, some files open.
        ("Manager process: CPU and memory", "A"): between(0.0, 64.0),
        ("Manager process: CPU and memory", "B"): between(10 / 1024, 16.0),
        ("Manager process: CPU and memory", "C"): between(3, 100_000),
        # only the trainer (b) reports progress: its series while it runs, none after
        ("Running jobs: steps per second", "A"): lambda found: (
            len(found) == (1 if "b" in vcs and m.running.get("b", 0) else 0)
            and all(dict(k)["vc"] == "b" and v > 0 for k, v in found.items())
        ),
    }


def substituted(expr: str, instance: str, vcs: tuple[str, ...]) -> str:
    """The query Grafana sends with these choices: a regex variable's values escaped and
    joined as `(x|y)` (a backslash doubled inside PromQL's double quotes)."""
    pattern = re.escape(instance).replace("\\", "\\\\")
    return (
        expr.replace("$job", SCRAPE_JOB)
        .replace("$instance", f"({pattern})")
        .replace("$vc", "(" + "|".join(vcs) + ")")
    )


def dashboard_targets() -> list[tuple[str, str, str]]:
    dashboard = yaml.safe_load((DEPLOY / "grafana" / "corral.json").read_text())
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


@pytest.mark.parametrize("moment", ["T0", "T1", "T2", "T3"])
def test_each_dashboard_query_reads_the_known_counts(live: Live, moment: str) -> None:
    m = live.moments[moment]
    targets = dashboard_targets()
    for vcs in (VCS, ("a",), ("b",)):  # All, then each VC alone
        expected = panel_expectations(m, vcs)
        assert {(title, ref) for title, ref, _ in targets} == set(expected)  # none unchecked
        for title, ref, expr in targets:
            query = substituted(expr, live.instance, vcs)
            found = normalised(live.prometheus.query(query, at=m.at))
            want = expected[(title, ref)]
            ok = want(found) if callable(want) else same(found, want)
            assert ok, f"{moment}, VCs {vcs}: {title} ({ref}): {query}\n got {found}\n want {want}"


# -- the alert rules -----------------------------------------------------------------------------

#: A comparison with a number (or a product of numbers) that ends a rule's condition.
THRESHOLD = re.compile(r"\s*(?:==|!=|>=|<=|>|<)\s*[0-9.]+(?:\s*\*\s*[0-9.]+)*\s*$")
#: `and`, with or without `on (...)`, between a rule's conditions.
AND = re.compile(r"\band\b(?:\s+on\s*\([^)]*\))?")


def rule_parts(expr: str) -> list[str]:
    """A rule's conditions, each less its threshold: the values the rule compares."""
    return [THRESHOLD.sub("", part.strip()) for part in AND.split(expr)]


def rule_expectations(m: Moment) -> dict[str, list[Expected]]:
    """Each rule's parts' answers at moment `m` (instance and job left out)."""
    started = sum(m.started.values())
    running = sum(m.running.values())

    def failures(vc: str) -> int:
        return sum(n for (v, _), n in m.failures.items() if v == vc)

    def one_node_at_zero(found: dict[Any, float]) -> bool:
        return len(found) == 1 and all(
            dict(k)["state"] == "unhealthy" and v == 0 for k, v in found.items()
        )

    return {
        "CorralManagerDown": [scalar(1)],
        "CorralManagerAbsent": [{}],
        "CorralGpusOffline": [scalar(0)],
        "CorralNodeUnhealthy": [one_node_at_zero],
        "CorralQueueingLong": [by("vc", {vc: quantile(0.95, m.waits.get(vc, [])) for vc in VCS})],
        "CorralFailureRateHigh": [
            by("vc", {vc: failures(vc) / max(m.started.get(vc, 0), 1) for vc in VCS}),
            by("vc", {vc: failures(vc) for vc in VCS}),
        ],
        "CorralInfrastructureFailures": [
            scalar(sum(n for (_, c), n in m.failures.items() if c in ("infrastructure", "hung")))
        ],
        "CorralSchedulingSlow": [between(1e-9, 10.0)],
        # a round at least every 5 s (--round-every-s), idle or not; 30 s allows for a busy host
        "CorralRoundsStalled": [between(0.0, 30.0)],
        "CorralNoProgress": [
            scalar(sum(m.pending.values())),
            scalar(2 - running - 0),  # free GPUs: all, less allocated, less offline
            scalar(started),
        ],
    }


def alert_rules() -> dict[str, str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


@pytest.mark.parametrize("moment", ["T0", "T1", "T2", "T3"])
def test_each_alert_rule_reads_the_known_counts(live: Live, moment: str) -> None:
    """None fires (the whole expression is empty at every moment), and what each compares reads
    what the story makes."""
    m = live.moments[moment]
    rules = alert_rules()
    expected = rule_expectations(m)
    assert set(rules) == set(expected)  # a new rule needs its expectation here
    for name, expr in rules.items():
        assert live.prometheus.query(expr, at=m.at) == [], f"{moment}: {name} fires"
        parts = rule_parts(expr)
        assert len(parts) == len(expected[name]), (name, parts)
        for part, want in zip(parts, expected[name], strict=True):
            found = normalised(live.prometheus.query(part, at=m.at))
            ok = want(found) if callable(want) else same(found, want)
            assert ok, f"{moment}: {name}: {part}\n got {found}\n want {want}"


def test_prometheus_evaluates_every_rule_without_error(live: Live) -> None:
    groups = live.prometheus.client.get("/api/v1/rules").json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == set(alert_rules())
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
        assert rule["state"] == "inactive", rule


# -- the counters, by hand -----------------------------------------------------------------------


def test_increase_counts_every_event_from_the_first(live: Live) -> None:
    """After 3 cancels, `increase(...[10m])` is 3; the submissions are the 7 submitted."""
    query = live.prometheus.query
    at = live.moments["T2"].at
    cancelled = 'sum(increase(corral_jobs_finished_total{status="CANCELLED"}[10m]))'
    assert normalised(query(cancelled, at=at)) == pytest.approx(scalar(3.0), rel=1e-9)
    submitted = "sum(increase(corral_jobs_submitted_total[10m]))"
    assert normalised(query(submitted, at=at)) == pytest.approx(scalar(7.0), rel=1e-9)
    by_user = "sum by (user) (increase(corral_jobs_submitted_total[10m]))"
    assert normalised(query(by_user, at=at)) == pytest.approx(
        by("user", {"alice": 4.0, "bob": 3.0, "admin": 0.0}), rel=1e-9
    )
    # anchor and trainer cancelled too by T3 (5 in all); bob's first cancel counted from 0
    end = live.moments["T3"].at
    assert normalised(query(cancelled, at=end)) == pytest.approx(scalar(5.0), rel=1e-9)
    bobs = 'increase(corral_jobs_finished_total{user="bob", status="CANCELLED"}[10m])'
    assert normalised(query(bobs, at=end)) == pytest.approx(
        {(("status", "CANCELLED"), ("user", "bob"), ("vc", "b")): 1.0}, rel=1e-9
    )


def test_every_state_has_a_series_before_it_has_a_job(live: Live) -> None:
    for name, m in live.moments.items():
        found = normalised(live.prometheus.query("corral_jobs", at=m.at))
        assert found == by("state", {s: float(n) for s, n in m.jobs.items()}), name
    # before any failure: FAILED is 0, not absent
    at = live.moments["T0"].at
    assert normalised(live.prometheus.query('corral_jobs{state="FAILED"}', at=at)) == {
        (("state", "FAILED"),): 0.0
    }


def test_per_job_gauges_name_the_job_job_id_and_end_with_it(live: Live) -> None:
    query = live.prometheus.query
    for name in ("corral_job_step", "corral_job_steps_per_second"):
        (series,) = query(name, at=live.moments["T2"].at)
        labels = series["metric"]
        assert labels["job"] == SCRAPE_JOB and labels["instance"] == live.instance
        assert labels["job_id"] == live.trainer and labels["name"] == "trainer"
        assert labels["vc"] == "b" and "exported_job" not in labels
        assert float(series["value"][1]) > 0
        assert query(name, at=live.moments["T3"].at) == []  # the job ended: no series
    # Prometheus's own labels are nowhere overwritten
    assert query('{__name__=~"corral_.*", exported_job!=""}', at=live.moments["T2"].at) == []
    assert query('{__name__=~"corral_.*", exported_instance!=""}', at=live.moments["T2"].at) == []


def test_the_substitution_is_what_grafana_sends() -> None:
    assert (
        substituted('x{job="$job", instance=~"$instance", vc=~"$vc"}', "127.0.0.1:80", ("a", "b"))
        == 'x{job="corral", instance=~"(127\\\\.0\\\\.0\\\\.1:80)", vc=~"(a|b)"}'
    )
    assert rule_parts("a > 0\nand on (instance) (b - c) > 4 * 3600\nand d == 0") == [
        "a",
        "(b - c)",
        "d",
    ]
    assert quantile(0.5, [0.2]) == 0.5  # one observation in (0, 1]: half way
    assert quantile(0.95, [0.2, 2.0]) == pytest.approx(1.0 + 4.0 * 0.9)  # rank 1.9: (1, 5]
    assert math.isnan(quantile(0.5, []))
