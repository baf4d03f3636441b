"""/metrics by Prometheus's conventions, on a live manager, and the queries of deploy/ against it.

One scenario runs through a real manager (two VCs of one GPU each, the local executor): alice's
two jobs run (one on b's idle GPU), bob's job takes b's GPU back (one preemption of VC a), then
succeeds; alice's two jobs are cancelled; bob's failing job fails twice (max_retries 1: one retry,
then FAILED). The counters must read exactly what that makes; the dashboard's and the alert rules'
queries must name only metrics the scrape has.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from corral.server.metrics import (
    FAILURE_CAUSES,
    FINAL_STATUSES,
    PREEMPTION_KINDS,
    QUEUEING_BUCKETS,
    ROUND_BUCKETS,
)
from tests.server.helpers import (
    REPO,
    TWO_VCS,
    admin_token,
    api,
    job,
    kill_jobs_of,
    python_job,
    start_server,
    submit,
    wait_for,
    wait_until,
)

SLEEPER = "import time; time.sleep(600)"
DEPLOY = REPO / "deploy"
#: Identifiers in PromQL that name a corral or process metric (labels and functions do not
#: start so).
METRIC_NAME = re.compile(r"\b((?:corral|process)_[a-zA-Z0-9_]+)\b")
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")


def family_of(name: str, families: set[str]) -> str | None:
    """The family a sample name belongs to: itself, or itself less a histogram's or counter's
    suffix (the parser names a counter's family without `_total`)."""
    if name in families:
        return name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return None


def samples(text: str) -> dict[str, list[Sample]]:
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        found.setdefault(family.name, []).extend(family.samples)
    return found


def values(scrape: dict[str, list[Sample]], family: str, sample: str) -> dict[tuple, float]:
    """One sample name's values by their labels (sorted (name, value) pairs)."""
    return {tuple(sorted(s.labels.items())): s.value for s in scrape[family] if s.name == sample}


def labels(**pairs: str) -> tuple:
    return tuple(sorted(pairs.items()))


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("metrics") / "corral"
    server = start_server(data_dir, gpus=2, config=TWO_VCS)
    try:
        admin = api(server.url, admin_token(data_dir))
        before = admin.get("/metrics").text

        def token(user: str, vc: str) -> str:
            return str(admin.post("/api/v1/tokens", json={"user": user, "vc": vc}).json()["token"])

        alice = api(server.url, token("alice", "a"))
        bob = api(server.url, token("bob", "b"))
        first = submit(alice, **python_job("first", SLEEPER, grace_seconds=2))
        second = submit(alice, **python_job("second", SLEEPER, grace_seconds=2))
        for job_id in (first, second):  # one on a's GPU, one on b's idle one
            wait_for(alice, job_id, ["RUNNING"])
        mine = submit(bob, **python_job("mine", "import time; time.sleep(0.5)"))
        assert wait_for(bob, mine)["status"] == "SUCCEEDED"
        # The preempted job of alice's runs again (its second attempt) on b's GPU, now free.
        wait_until(
            lambda: all(
                (found := job(alice, j))["status"] == "RUNNING"
                and found["attempts"] == 1 + found["preemptions"]
                for j in (first, second)
            ),
            "both of alice's jobs running again",
        )
        for job_id in (first, second):
            assert alice.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
        failing = submit(bob, **python_job("failing", "import sys; sys.exit(3)", max_retries=1))
        assert wait_for(bob, failing)["status"] == "FAILED"
        jobs = {j: job(admin, j) for j in (first, second, mine, failing)}
        wait_until(  # the cancelled jobs' processes gone: nothing holds a GPU any more
            lambda: all(
                a["state"] == "ended" for j in jobs for a in job(admin, j)["attempt_history"]
            ),
            "every attempt ended",
        )
        text = admin.get("/metrics")
        assert text.headers["content-type"].startswith("text/plain; version=")
        yield {"before": before, "text": text.text, "jobs": jobs}
    finally:
        server.stop()
        kill_jobs_of(data_dir)


def zeros(**choices: Iterable[Any]) -> dict[tuple, float]:
    """Every label set of these labels' values, at 0: what a counter shows before it counts."""
    names = sorted(choices)
    return {
        tuple(zip(names, combination, strict=True)): 0
        for combination in itertools.product(*(list(choices[n]) for n in names))
    }


#: The (VC, user) pairs with series from the start: the admin's token is bound to no VC (both),
#: alice's to a, bob's to b.
OWNERS = [("a", "admin"), ("b", "admin"), ("a", "alice"), ("b", "bob")]


def by_owner(**counts: int) -> dict[tuple, float]:
    """Every (VC, user) pair of OWNERS at 0 but those given ("a_alice": 2)."""
    found = {labels(vc=vc, user=user): 0.0 for vc, user in OWNERS}
    for key, count in counts.items():
        vc, user = key.split("_")
        found[labels(vc=vc, user=user)] = count
    return found


def test_the_counters_read_what_happened_with_their_labels(scenario: dict[str, Any]) -> None:
    scrape = samples(scenario["text"])
    assert values(scrape, "corral_jobs_submitted", "corral_jobs_submitted_total") == by_owner(
        a_alice=2, b_bob=2
    )
    # a: two first starts and the preempted job's second; b: mine once, failing twice
    assert values(scrape, "corral_attempts_started", "corral_attempts_started_total") == {
        labels(vc="a"): 3,
        labels(vc="b"): 3,
    }
    assert values(scrape, "corral_preemptions", "corral_preemptions_total") == zeros(
        vc="ab", kind=PREEMPTION_KINDS
    ) | {labels(vc="a", kind="preempted"): 1}
    assert values(scrape, "corral_attempt_failures", "corral_attempt_failures_total") == zeros(
        vc="ab", cause=FAILURE_CAUSES
    ) | {labels(vc="b", cause="user"): 2}
    assert values(scrape, "corral_retries", "corral_retries_total") == {
        labels(vc="a"): 0,
        labels(vc="b"): 1,
    }
    finished = {
        labels(vc=vc, user=user, status=status): 0
        for vc, user in OWNERS
        for status in FINAL_STATUSES
    }
    assert values(scrape, "corral_jobs_finished", "corral_jobs_finished_total") == finished | {
        labels(vc="a", user="alice", status="CANCELLED"): 2,
        labels(vc="b", user="bob", status="SUCCEEDED"): 1,
        labels(vc="b", user="bob", status="FAILED"): 1,
    }
    jobs = scenario["jobs"]
    assert sum(j["preemptions"] for j in jobs.values()) == 1
    assert sum(j["attempts"] for j in jobs.values()) == 6


def test_the_queueing_histogram_counts_first_starts_and_sums_their_waits(
    scenario: dict[str, Any],
) -> None:
    scrape = samples(scenario["text"])
    family = "corral_job_queueing_seconds"
    counts = values(scrape, family, f"{family}_count")
    assert counts == {labels(vc="a"): 2, labels(vc="b"): 2}  # every job started once first
    waits: dict[str, float] = {"a": 0.0, "b": 0.0}
    for found in scenario["jobs"].values():
        waits[found["vc"]] += found["started_at"] - found["submitted_at"]
    sums = values(scrape, family, f"{family}_sum")
    for vc, waited in waits.items():
        assert sums[labels(vc=vc)] == pytest.approx(waited, abs=1e-6)
    buckets = [s for s in scrape[family] if s.name == f"{family}_bucket"]
    for vc in ("a", "b"):
        mine = [s for s in buckets if s.labels["vc"] == vc]
        bounds = [float(s.labels["le"]) for s in mine]
        assert bounds == [*QUEUEING_BUCKETS, float("inf")]
        cumulative = [s.value for s in mine]
        assert cumulative == sorted(cumulative) and cumulative[-1] == 2


def test_the_round_histogram_is_consistent(scenario: dict[str, Any]) -> None:
    scrape = samples(scenario["text"])
    family = "corral_scheduling_round_seconds"
    count = values(scrape, family, f"{family}_count")[()]
    total = values(scrape, family, f"{family}_sum")[()]
    buckets = [s for s in scrape[family] if s.name == f"{family}_bucket"]
    assert [float(s.labels["le"]) for s in buckets] == [*ROUND_BUCKETS, float("inf")]
    cumulative = [s.value for s in buckets]
    assert cumulative == sorted(cumulative) and cumulative[-1] == count
    assert count >= 6  # a round at least for each start and each end
    # The sum lies within what the buckets allow: a round in the bucket (lower, upper] took
    # more than lower and at most upper seconds.
    finite = cumulative[: len(ROUND_BUCKETS)]
    assert finite[-1] == count  # no round took more than 10 s here
    in_bucket = [after - before for before, after in zip([0.0, *finite[:-1]], finite, strict=True)]
    lowers = [0.0, *ROUND_BUCKETS[:-1]]
    low = sum(n * bound for n, bound in zip(in_bucket, lowers, strict=True))
    high = sum(n * bound for n, bound in zip(in_bucket, ROUND_BUCKETS, strict=True))
    assert low <= total <= high and total > 0
    assert not any(name.endswith(("_p50", "_p90", "_p99")) for name in scrape)  # gone


def test_state_gauges_process_and_build_info(scenario: dict[str, Any]) -> None:
    scrape = samples(scenario["text"])
    assert values(scrape, "corral_queue_length", "corral_queue_length") == {
        labels(vc="a"): 0,
        labels(vc="b"): 0,
    }
    assert values(scrape, "corral_jobs_running", "corral_jobs_running") == {
        labels(vc="a"): 0,
        labels(vc="b"): 0,
    }
    assert values(scrape, "corral_gpus", "corral_gpus") == {(): 2}
    assert values(scrape, "corral_gpus_offline", "corral_gpus_offline") == {(): 0}
    assert values(scrape, "corral_jobs", "corral_jobs") == zeros(state=STATES) | {
        labels(state="CANCELLED"): 2,
        labels(state="FAILED"): 1,
        labels(state="SUCCEEDED"): 1,
    }
    import platform

    import corral

    assert values(scrape, "corral_build_info", "corral_build_info") == {
        labels(version=corral.__version__, python=platform.python_version()): 1
    }
    assert values(scrape, "process_resident_memory_bytes", "process_resident_memory_bytes")[()] > 0
    assert "python_info" in scrape
    assert "_created" not in scenario["text"]  # no creation-time series (text format)


def test_no_metric_has_a_label_prometheus_sets(scenario: dict[str, Any]) -> None:
    """`job` and `instance` are Prometheus's own (the scrape job, the target): a metric's label
    of either name would be stored as `exported_job` / `exported_instance`."""
    for text in (scenario["before"], scenario["text"]):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                assert not {"job", "instance"} & set(sample.labels), sample


def test_a_fresh_manager_has_every_known_series_at_zero(scenario: dict[str, Any]) -> None:
    """Before anything happens every label set known has its series at 0 (so that increase()
    and rate() see the first event): each VC's with each cause, kind and final status, the
    admin's (the only token yet: bound to no VC, both) submissions and ends, every state of
    corral_jobs."""
    scrape = samples(scenario["before"])
    admins = [("a", "admin"), ("b", "admin")]
    assert values(scrape, "corral_jobs_submitted", "corral_jobs_submitted_total") == {
        labels(vc=vc, user=user): 0 for vc, user in admins
    }
    assert values(scrape, "corral_jobs_finished", "corral_jobs_finished_total") == {
        labels(vc=vc, user=user, status=status): 0
        for vc, user in admins
        for status in FINAL_STATUSES
    }
    for family, label in (
        ("corral_attempt_failures", dict(cause=FAILURE_CAUSES)),
        ("corral_preemptions", dict(kind=PREEMPTION_KINDS)),
        ("corral_attempts_started", {}),
        ("corral_retries", {}),
    ):
        assert values(scrape, family, f"{family}_total") == zeros(vc="ab", **label), family
    family = "corral_job_queueing_seconds"
    assert values(scrape, family, f"{family}_count") == zeros(vc="ab")
    assert values(scrape, "corral_jobs", "corral_jobs") == zeros(state=STATES)
    assert values(scrape, "corral_gpus", "corral_gpus") == {(): 2}


def deploy_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every query in deploy/: the dashboard's targets and templating, the
    alert rules' exprs."""
    import yaml

    found = []
    dashboard = json.loads((DEPLOY / "grafana" / "corral.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found.append((f"dashboard panel {panel['title']!r}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"dashboard variable {variable['name']}", variable["definition"]))
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            found.append((f"alert {rule['alert']}", rule["expr"]))
    return found


def test_deploy_queries_name_only_metrics_the_manager_exports(scenario: dict[str, Any]) -> None:
    families = set(samples(scenario["text"]))
    queries = deploy_queries()
    assert len(queries) >= 20
    named = set()
    for where, expr in queries:
        for name in METRIC_NAME.findall(expr):
            named.add(name)
            assert family_of(name, families) is not None, f"{where}: {name} is not exported"
    # the dashboard and the rules cover what the brief of each asks for
    for needed in (
        "corral_queue_length",
        "corral_jobs_running",
        "corral_gpus_allocated",
        "corral_gpus",
        "corral_gpus_offline",
        "corral_job_queueing_seconds_bucket",
        "corral_scheduling_round_seconds_bucket",
        "corral_last_round_timestamp_seconds",
        "corral_jobs_submitted_total",
        "corral_attempts_started_total",
        "corral_preemptions_total",
        "corral_attempt_failures_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert needed in named


#: A metric named in PromQL with what follows it: its matchers, if any.
SELECTOR = re.compile(r"\b((?:corral|process)_[a-zA-Z0-9_]+)(\{[^}]*\})?")


def unfiltered(expr: str, with_vc: set[str]) -> list[str]:
    """The metrics of `expr` not filtered by the dashboard's variables: each by `job="$job"` and
    `instance=~"$instance"`, and by `vc=~"$vc"` those in `with_vc` (the ones with a vc label)."""
    missing = []
    for name, matchers in SELECTOR.findall(expr):
        wanted = ['job="$job"', 'instance=~"$instance"']
        if name in with_vc:
            wanted.append('vc=~"$vc"')
        if not all(matcher in (matchers or "") for matcher in wanted):
            missing.append(name)
    return missing


def test_every_dashboard_query_honours_the_variables(scenario: dict[str, Any]) -> None:
    """Every panel's query is filtered by the scrape job, the manager and (where the metric has
    one) the VC chosen; the variables by those before them."""
    with_vc = {
        sample.name
        for found in samples(scenario["text"]).values()
        for sample in found
        if "vc" in sample.labels
    }
    assert {"corral_queue_length", "corral_jobs_submitted_total"} <= with_vc
    dashboard = json.loads((DEPLOY / "grafana" / "corral.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            assert not unfiltered(target["expr"], with_vc), (panel["title"], target["expr"])
    variables = {v["name"]: v["definition"] for v in dashboard["templating"]["list"][1:]}
    assert variables == {
        "job": "label_values(corral_build_info, job)",
        "instance": 'label_values(corral_build_info{job="$job"}, instance)',
        "vc": 'label_values(corral_gpus_guaranteed{job="$job", instance=~"$instance"}, vc)',
    }
    # the check itself: a query missing a variable is caught
    assert unfiltered('sum(corral_queue_length{instance=~"$instance"})', with_vc) == [
        "corral_queue_length"
    ]
    assert unfiltered("rate(process_cpu_seconds_total[5m])", with_vc) == [
        "process_cpu_seconds_total"
    ]
    assert not unfiltered('corral_gpus{job="$job", instance=~"$instance"}', with_vc)


def test_the_name_check_catches_a_metric_that_does_not_exist(scenario: dict[str, Any]) -> None:
    families = set(samples(scenario["text"]))
    assert family_of("corral_jobs_submitted_total", families) == "corral_jobs_submitted"
    assert family_of("corral_job_queueing_seconds_bucket", families) is not None
    assert family_of("corral_job_queueing_seconds_total", families) is not None  # (a suffix)
    assert family_of("corral_queue_lengths", families) is None
    assert family_of("corral_scheduling_round_seconds_p99", families) is None
    assert METRIC_NAME.findall('sum by (vc) (rate(corral_x_total{vc="a"}[5m]))') == [
        "corral_x_total"
    ]


def test_failure_causes_are_the_documented_ones() -> None:
    text = (REPO / "docs" / "server.md").read_text()
    for cause in FAILURE_CAUSES:
        assert f"`{cause}`" in text


PROMTOOL = shutil.which("promtool")


def promtool() -> str:
    """The promtool binary; a failure, not a skip, without it: the rules must be checked."""
    if PROMTOOL is None:
        pytest.fail("the alert rules' tests need promtool: apt-get install -y prometheus")
    return PROMTOOL


def test_promtool_checks_and_unit_tests_the_alert_rules(tmp_path: Path) -> None:
    tool = promtool()
    rules = DEPLOY / "prometheus"
    for command in (
        [tool, "check", "rules", "alerts.yaml"],
        [tool, "test", "rules", "alerts.test.yaml"],
    ):
        done = subprocess.run(command, cwd=rules, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    # The scrape config names the metrics token file beside it, which promtool wants to see: it
    # is checked where it is installed, with a token copied there.
    for name in ("prometheus.yml", "alerts.yaml"):
        shutil.copy(rules / name, tmp_path / name)
    (tmp_path / "corral-metrics.token").write_text("x" * 64 + "\n")
    done = subprocess.run(
        [tool, "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    tool = promtool()
    broken = tmp_path / "alerts.yaml"
    text = (DEPLOY / "prometheus" / "alerts.yaml").read_text()
    broken.write_text(text.replace("expr: corral_gpus_offline > 0", "expr: corral_gpus_offline >"))
    done = subprocess.run(
        [tool, "check", "rules", str(broken)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0


def test_gpus_offline_and_a_lost_attempt_as_infrastructure(tmp_path: Path) -> None:
    """HiveD's fixed cluster on Ray (tests/server/test_node_changes.py): a declared node that is
    not live is held out (offline), and an attempt lost with its node is an infrastructure
    failure, retried."""
    from corral.core.cluster import Cluster, NodeDef
    from corral.server.manager import Manager
    from corral.server.spec import parse_job_spec
    from corral.server.store import Store
    from tests.server.helpers import manager_settings
    from tests.server.inert import HeldExecutor

    live = [NodeDef("n1", 4, "gpu")]
    executor = HeldExecutor()
    manager = Manager(
        Store(Store.sqlite_url(tmp_path)),
        executor,
        Cluster.from_nodes([NodeDef("n1", 4, "gpu"), NodeDef("n2", 4, "gpu")]),
        tmp_path,
        settings=manager_settings(node_check_s=0.0, relax_after_s=0.0, retry_backoff_s=0.0),
        nodes=lambda: list(live),
        fixed_cluster=True,
    )

    try:

        def scrape() -> dict[str, list[Sample]]:
            body, _ = manager.metrics.text()
            return samples(body.decode())

        manager.submit(parse_job_spec(python_job("first", "pass", gpus=4)), "u")
        manager.step()
        assert values(scrape(), "corral_gpus_offline", "corral_gpus_offline") == {(): 4}
        live.append(NodeDef("n2", 4, "gpu"))
        manager.step()
        assert values(scrape(), "corral_gpus_offline", "corral_gpus_offline") == {(): 0}
        (running,) = executor.running
        executor.end(*running, "lost: rank 0's Ray actor died (its node died)")
        manager.step()
        found = scrape()
        assert values(found, "corral_attempt_failures", "corral_attempt_failures_total") == zeros(
            vc=["default"], cause=FAILURE_CAUSES
        ) | {labels(vc="default", cause="infrastructure"): 1}
        assert values(found, "corral_retries", "corral_retries_total") == {labels(vc="default"): 1}
        # user u has no token (a direct submission): its ends start at 0 with its first job
        assert values(found, "corral_jobs_finished", "corral_jobs_finished_total") == zeros(
            vc=["default"], user=["u"], status=FINAL_STATUSES
        )
    finally:
        manager.store.close()


def test_a_restarted_manager_knows_the_users_of_live_tokens_and_waiting_jobs(
    tmp_path: Path,
) -> None:
    """At its start (recovery) a manager gives a series at 0 to: each live token's user, with
    its VC or (bound to none) every VC; the users of the jobs that wait, token or not. Not to a
    revoked or expired token's user with nothing waiting."""
    import time

    from corral.core.cluster import Cluster, NodeDef
    from corral.server import auth
    from corral.server.manager import Manager
    from corral.server.spec import parse_job_spec
    from corral.server.store import Store
    from tests.server.helpers import manager_settings
    from tests.server.inert import HeldExecutor

    def manager() -> Manager:
        return Manager(
            Store(Store.sqlite_url(tmp_path)),
            HeldExecutor(),
            Cluster.from_nodes([NodeDef("n1", 1, "gpu")]),
            tmp_path,
            vc_quota={"a": 1, "b": 1},
            settings=manager_settings(),
        )

    first = manager()
    try:
        store = first.store
        auth.create_token(store, "alice")  # bound to no VC: both
        auth.create_token(store, "bob", vc="a")
        auth.create_token(store, "dave", vc="a")
        store.revoke_tokens(time.time(), user="dave")
        auth.create_token(store, "erin", vc="b", expires_at=time.time() - 1)
        first.submit(parse_job_spec(python_job("carols", "pass", vc="b")), "carol")  # no token
    finally:
        first.store.close()
    second = manager()
    try:
        second.recover()
        body, _ = second.metrics.text()
        found = samples(body.decode())
        owners = {labels(vc="a", user="alice"): 0, labels(vc="b", user="alice"): 0}
        owners |= {labels(vc="a", user="bob"): 0, labels(vc="b", user="carol"): 0}
        assert values(found, "corral_jobs_submitted", "corral_jobs_submitted_total") == owners
        finished = values(found, "corral_jobs_finished", "corral_jobs_finished_total")
        assert finished == {
            tuple(sorted((*key, ("status", status)))): 0
            for key in owners
            for status in FINAL_STATUSES
        }
    finally:
        second.store.close()


def test_time_limit_and_hang_are_their_own_causes(tmp_path: Path) -> None:
    data_dir = tmp_path / "corral"
    server = start_server(data_dir, gpus=2)
    try:
        admin = api(server.url, admin_token(data_dir))
        limited = submit(admin, **python_job("limited", SLEEPER, time_limit=1, grace_seconds=1))
        hung = submit(
            admin, **python_job("hung", SLEEPER, progress_timeout=1, max_retries=0, grace_seconds=1)
        )
        assert wait_for(admin, limited)["status"] == "FAILED"
        ended = wait_for(admin, hung)
        found = samples(admin.get("/metrics").text)
        failures = values(found, "corral_attempt_failures", "corral_attempt_failures_total")
        # A hang is the infrastructure's fault: retried whatever max_retries, until the same
        # fast failure repeated ends the job; every attempt of it hung.
        assert failures[labels(vc="default", cause="time_limit")] == 1
        assert ended["status"] == "FAILED"
        assert failures[labels(vc="default", cause="hung")] == ended["attempts"] >= 2
        retries = values(found, "corral_retries", "corral_retries_total")
        assert retries == {labels(vc="default"): ended["attempts"] - 1}
        assert {key for key, count in failures.items() if count} == {
            labels(vc="default", cause="time_limit"),
            labels(vc="default", cause="hung"),
        }
    finally:
        server.stop()
        kill_jobs_of(data_dir)


def test_the_dashboard_is_grafana_json_whose_panels_do_not_overlap() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "corral.json").read_text())
    assert dashboard["schemaVersion"] == 39
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
        box = panel["gridPos"]
        assert 0 <= box["x"] and box["x"] + box["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
    # queueing p50/p95 from the histogram's buckets over a 5-minute rate
    queueing = [
        t["expr"]
        for p in panels
        for t in p["targets"]
        if "corral_job_queueing_seconds" in t["expr"]
    ]
    assert any(e.startswith("histogram_quantile(0.95,") and "[5m]" in e for e in queueing)
    assert any(e.startswith("histogram_quantile(0.5,") for e in queueing)
