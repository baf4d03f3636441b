"""What a job reports is not trusted (docs/progress.md, "What corral trusts"): its reports are
stamped with the manager's clock, an attempt measured faster than the ceiling is rejected and
what it measured is taken back, and a tenant's measurements are its own VC's.

The telemetry here is the manager's own (corral.server.telemetry) on a real SQLite store, reading
a real progress file that the test appends to, at instants of a fake clock: every rate below is
worked out by hand from the lines written and the instants they were read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.core.profiles import Measure, Shape
from corral.server.store import ProfileRow, Store
from corral.server.telemetry import Telemetry

BERT = Shape("bert-large", "gpu", 1, vc="nlp")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(Store.sqlite_url(tmp_path))
    try:
        for job_id in (1, 2):
            store.insert_job(
                job_id,
                name=f"j{job_id}",
                user="bob",
                vc="nlp",
                priority="guaranteed",
                gpus=1,
                spec={},
                submitted_at=0.0,
            )
        yield store
    finally:
        store.close()


class Job:
    """A job's progress file, appended to as a job would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, *reports: dict[str, float]) -> None:
        with self.path.open("a") as handle:
            handle.write("".join(json.dumps(report) + "\n" for report in reports))


def watched(telemetry: Telemetry, tmp_path: Path, job_id: str = "1", now: float = 100.0) -> Job:
    job = Job(tmp_path / f"job-{job_id}" / "rank-0.progress")
    telemetry.watch(job_id, 1, job.path, BERT, now, resumed=False)
    return job


def rows(store: Store) -> dict[tuple[str, str], tuple[float, float, int]]:
    return {(p.vc, p.model): (p.steps_per_s, p.seconds, p.runs) for p in store.profiles()}


def test_reports_are_stamped_with_the_managers_clock_not_the_jobs(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = watched(telemetry, tmp_path)
    # The job's own times say 1,000 s between its reports (a clock in milliseconds, or a lie);
    # the manager read them 10 s apart: 50 steps in 10 s is 5 steps/s, not 0.05.
    job.write({"step": 0, "time": 1_000_000.0})
    telemetry.poll(100.0)
    job.write({"step": 50, "time": 1_001_000.0})
    telemetry.poll(110.0)
    row = store.get_job(1)
    assert row is not None and row.progress is not None
    assert row.progress.steps_per_s == 5.0
    assert row.progress.at == 110.0
    telemetry.unwatch("1", 110.0)
    assert rows(store) == {("nlp", "bert-large"): (5.0, 10.0, 1)}


def test_a_rate_runs_from_the_latest_report_of_one_read_to_the_latest_of_another(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = watched(telemetry, tmp_path)
    # Five reports found by one read (written while the manager was not looking): the latest,
    # step 40, is where the job was at 100 s; the earlier ones were written before.
    job.write(*({"step": float(step)} for step in range(0, 50, 10)))
    telemetry.poll(100.0)
    job.write({"step": 70}, {"step": 90})
    telemetry.poll(110.0)
    telemetry.unwatch("1", 110.0)
    # (90 - 40) / 10 = 5 steps/s; from the read's first report (step 0) it would be 9.
    assert rows(store) == {("nlp", "bert-large"): (5.0, 10.0, 1)}


def test_a_rate_at_the_ceiling_counts_and_one_above_it_is_rejected(
    store: Store, tmp_path: Path
) -> None:
    # Ceiling 100 steps/s. Job 1 makes 1,000 steps in 10 s: 100, counted. Job 2 makes 1,001:
    # 100.1, rejected.
    telemetry = Telemetry(store, fold_every_s=1000.0, max_steps_per_s=100.0)
    first, second = watched(telemetry, tmp_path, "1"), watched(telemetry, tmp_path, "2")
    first.write({"step": 0})
    second.write({"step": 0})
    telemetry.poll(100.0)
    first.write({"step": 1000})
    second.write({"step": 1001})
    telemetry.poll(110.0)
    assert telemetry.rejected == {
        "2": "attempt 1: rejected: 100.1 steps/s (step 0 to 1001 in 10 s by the manager's clock) "
        "is above the ceiling of 100 steps/s (max_steps_per_s); none of its measurements count"
    }
    telemetry.unwatch("1", 110.0)
    telemetry.unwatch("2", 110.0)
    assert rows(store) == {("nlp", "bert-large"): (100.0, 10.0, 1)}
    shown = store.get_job(2)
    assert shown is not None and shown.progress is not None
    assert (shown.progress.step, shown.progress.steps_per_s) == (1001.0, None)
    assert [(e.kind, e.message) for e in store.events(2)] == [("progress", telemetry.rejected["2"])]
    # Its next attempt is measured afresh; the event stays.
    telemetry.watch("2", 2, tmp_path / "job-2" / "again.progress", BERT, 120.0, resumed=False)
    assert telemetry.rejected == {} and len(store.events(2)) == 1


def test_a_rejected_attempt_takes_back_what_it_had_measured(store: Store, tmp_path: Path) -> None:
    # nlp measured bert-large at 4 steps/s over 60 s before; a trace's row (no VC) and vision's
    # row are other VCs' business. Job 1 is honest for 10 s (fold: 20 steps/s over 10 s, so
    # nlp's row becomes (4 x 60 + 20 x 10) / 70 = 6.2857 over 70 s, 2 runs), then claims two
    # million steps a second later: (2,000,200 - 0) / 11 s by the window, above 100,000.
    for vc, rate in (("nlp", 4.0), ("", 9.0), ("vision", 7.0)):
        store.save_profile(ProfileRow("bert-large", "gpu", 1, 1, "", rate, None, 60.0, 1, 0.0, vc))
    telemetry = Telemetry(store, fold_every_s=10.0)
    job = watched(telemetry, tmp_path)
    job.write({"step": 0})
    telemetry.poll(100.0)
    job.write({"step": 200})
    telemetry.poll(110.0)  # 10 s of reports: folded
    assert rows(store)[("nlp", "bert-large")] == (pytest.approx(440.0 / 70.0), 70.0, 2)
    assert telemetry.profiles.rate("bert-large", "gpu", 1, vc="nlp") == pytest.approx(440 / 70)
    job.write({"step": 2_000_200})
    telemetry.poll(111.0)
    assert telemetry.rejected["1"].startswith(
        "attempt 1: rejected: 1.818e+05 steps/s (step 0 to 2000200 in 11 s by the manager's "
        "clock) is above the ceiling of 100000 steps/s"
    )
    # Its 10 s are taken back: nlp's row is what it was; the others never moved.
    assert rows(store) == {
        ("", "bert-large"): (9.0, 60.0, 1),
        ("nlp", "bert-large"): (pytest.approx(4.0), pytest.approx(60.0), 1),
        ("vision", "bert-large"): (7.0, 60.0, 1),
    }
    assert telemetry.profiles.rate("bert-large", "gpu", 1, vc="nlp") == pytest.approx(4.0)
    # Nothing more of it counts, however plausible it looks from here on: back to step 300
    # (its rate starts again), then 100 steps in 10 s.
    job.write({"step": 300})
    telemetry.poll(130.0)
    job.write({"step": 400})
    telemetry.poll(140.0)
    telemetry.unwatch("1", 140.0)
    assert rows(store)[("nlp", "bert-large")] == (pytest.approx(4.0), pytest.approx(60.0), 1)
    # A shape only the rejected attempt had measured is forgotten altogether.
    other = Telemetry(store, fold_every_s=10.0)
    job = Job(tmp_path / "again" / "rank-0.progress")
    other.watch("2", 1, job.path, Shape("gpt", "gpu", 1, vc="nlp"), 100.0, resumed=False)
    job.write({"step": 0})
    other.poll(100.0)
    job.write({"step": 100})
    other.poll(110.0)
    assert ("nlp", "gpt") in rows(store)
    job.write({"step": 10**9})
    other.poll(112.0)
    assert ("nlp", "gpt") not in rows(store)
    assert other.profiles.get(Shape("gpt", "gpu", 1, vc="nlp")) is None


def test_steps_going_back_within_an_attempt_start_its_rate_again(
    store: Store, tmp_path: Path
) -> None:
    # A restart inside the attempt (torchrun's --max-restarts) restores step 100 from a
    # checkpoint after reaching 300: not a lie. The rate starts again from the restored step
    # (what came before it is dropped, restore included): 100 -> 250 in 10 s, 15 steps/s.
    telemetry = Telemetry(store, fold_every_s=1000.0, max_steps_per_s=100.0)
    job = watched(telemetry, tmp_path)
    job.write({"step": 0})
    telemetry.poll(100.0)
    job.write({"step": 300})
    telemetry.poll(110.0)
    job.write({"step": 100})
    telemetry.poll(120.0)
    job.write({"step": 250})
    telemetry.poll(130.0)
    row = store.get_job(1)
    assert row is not None and row.progress is not None
    assert row.progress.steps_per_s == 15.0
    assert telemetry.rejected == {}
    telemetry.unwatch("1", 130.0)
    assert store.profiles()[0].steps_per_s == 15.0


def test_a_measurement_is_kept_under_the_vc_of_the_job_that_made_it(
    store: Store, tmp_path: Path
) -> None:
    telemetry = Telemetry(store, fold_every_s=1000.0)
    job = Job(tmp_path / "vision" / "rank-0.progress")
    telemetry.watch(
        "1", 1, job.path, Shape("bert-large", "gpu", 1, vc="vision"), 0.0, resumed=False
    )
    job.write({"step": 0})
    telemetry.poll(0.0)
    job.write({"step": 5000})
    telemetry.poll(10.0)
    telemetry.unwatch("1", 10.0)
    assert rows(store) == {("vision", "bert-large"): (500.0, 10.0, 1)}
    profiles = telemetry.profiles
    assert profiles.rate("bert-large", "gpu", 1, vc="vision") == 500.0
    assert profiles.rate("bert-large", "gpu", 1, vc="nlp") is None
    # An admin shares the model: stored, and nlp reads vision's measurement now.
    assert telemetry.share("bert-large", True, "root", 20.0)
    assert [(m.model, m.marked_by, m.marked_at) for m in store.shared_models()] == [
        ("bert-large", "root", 20.0)
    ]
    assert profiles.view("nlp").get(Shape("bert-large", "gpu", 1)) == Measure(500.0, 10.0, 1)
    assert Telemetry(store).profiles.shared == {"bert-large"}  # a restart reads it back
    assert telemetry.share("bert-large", False, "root", 30.0)
    assert not telemetry.share("bert-large", False, "root", 30.0)
    assert profiles.rate("bert-large", "gpu", 1, vc="nlp") is None
    assert store.shared_models() == []


def test_corral_up_takes_the_ceiling_and_refuses_a_nonsense_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app  # (before corral.cli.up, which it imports)
    from corral.server.manager import Manager

    seen: list[float | None] = []

    def serve(manager: Manager, options: object) -> None:
        seen.append(manager.telemetry.max_steps_per_s)
        manager.stop()

    monkeypatch.setattr("corral.cli.up.serve", serve)
    args = ["up", "--gpus", "1", "--single-user", "--data-dir", str(tmp_path / "d")]
    assert CliRunner().invoke(app, args).exit_code == 0
    result = CliRunner().invoke(app, [*args, "--max-steps-per-s", "5000"])
    assert result.exit_code == 0, result.output
    assert seen == [100_000.0, 5000.0]
    for bad in ("0", "-1", "inf"):
        result = CliRunner().invoke(app, [*args, "--max-steps-per-s", bad])
        assert result.exit_code != 0
        assert result.output.strip().endswith(
            f"--max-steps-per-s: must be a positive number of steps/s, got {float(bad):g}"
        ), result.output


def test_users_see_their_vcs_profiles_and_only_admins_mark_a_model_shared(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from corral.cli.main import app
    from tests.server.helpers import TWO_VCS, admin_token, api, start_server

    data_dir = tmp_path / "corral"
    server = start_server(data_dir, gpus=2, config=TWO_VCS)
    clients = []
    try:
        store = server.manager.store
        for vc, model, rate in (("a", "bert", 4.0), ("b", "bert", 5000.0), ("", "resnet", 10.0)):
            store.save_profile(ProfileRow(model, "gpu", 1, 1, "", rate, None, 60.0, 1, 0.0, vc))
        admin = api(server.url, admin_token(data_dir))
        clients.append(admin)
        tokens = {}
        for vc in ("a", "b"):
            made = admin.post("/api/v1/tokens", json={"user": f"user-{vc}", "vc": vc})
            assert made.status_code == 201, made.text
            tokens[vc] = made.json()["token"]
            clients.append(api(server.url, tokens[vc]))
        user_a = clients[1]

        def seen(client: httpx.Client) -> set[tuple[str, str, bool]]:
            listed = client.get("/api/v1/profiles")
            assert listed.status_code == 200, listed.text
            return {(p["vc"], p["model"], p["shared"]) for p in listed.json()}

        # a's user sees a's measurements and those of no VC, not b's; the admin sees all.
        assert seen(user_a) == {("a", "bert", False), ("", "resnet", False)}
        assert seen(admin) == {("a", "bert", False), ("b", "bert", False), ("", "resnet", False)}
        # Only an admin marks a model shared; a bad body is refused naming the field.
        refused = user_a.post("/api/v1/profiles/share", json={"model": "bert"})
        assert (refused.status_code, refused.json()["detail"]) == (
            403,
            "only an admin may mark a model shared",
        )
        for body, detail in (
            ({}, "model: must be a non-empty string"),
            ({"model": " "}, "model: must be a non-empty string"),
            ({"model": 3}, "model: must be a non-empty string"),
            ({"model": "a\nb"}, "model: at most 128 characters, none of them control characters"),
            ({"model": "bert", "vc": "a"}, "'vc': unknown field; the fields are model"),
        ):
            answer = admin.post("/api/v1/profiles/share", json=body)
            assert (answer.status_code, answer.json()["detail"]) == (422, detail)
        assert admin.get("/api/v1/profiles/shared").json() == []
        answer = admin.post("/api/v1/profiles/share", json={"model": "bert"})
        assert answer.json() == {"model": "bert", "shared": True, "changed": True}
        again = admin.post("/api/v1/profiles/share", json={"model": "bert"})
        assert again.json()["changed"] is False
        # Marked: stored, in the manager's profiles, and every user sees every VC's bert.
        (mark,) = user_a.get("/api/v1/profiles/shared").json()
        assert (mark["model"], mark["marked_by"]) == ("bert", "admin")
        assert server.manager.telemetry.profiles.shared == {"bert"}
        assert seen(user_a) == {("a", "bert", True), ("b", "bert", True), ("", "resnet", False)}

        def corral(token: str, *args: str) -> tuple[int, str]:
            env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": token}
            result = CliRunner().invoke(app, list(args), env=env)
            return result.exit_code, result.output

        code, output = corral(tokens["a"], "profile", "unshare", "bert")
        assert code == 1 and "only an admin may unmark a model shared" in output
        assert corral(admin_token(data_dir), "profile", "unshare", "bert") == (
            0,
            "bert is now not shared\n",
        )
        assert server.manager.telemetry.profiles.shared == frozenset()
        assert corral(admin_token(data_dir), "profile", "unshare", "bert") == (
            0,
            "bert is already not shared\n",
        )
        code, output = corral(tokens["a"], "profile", "ls")
        assert code == 0, output
        table = [line.split() for line in output.splitlines()]
        assert table[0][:7] == ["MODEL", "GPU", "TYPE", "GPUS", "NODES", "SHARED", "WITH"]
        assert sorted(row[:6] for row in table[1:]) == [
            ["bert", "gpu", "1", "1", "-", "a"],
            ["resnet", "gpu", "1", "1", "-", "-"],
        ]
    finally:
        for client in clients:
            client.close()
        server.stop()
