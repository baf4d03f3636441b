"""One tenant cannot poison another's measured speeds (issue 30): a real `corral up` as root, two
VCs, alice's and bob's jobs under Unix accounts the test creates (tests/server/test_security.py's
`site`), each a shell script that appends its own progress lines.

- bob's honest bert-large job in nlp is measured on the manager's clock: its rate is the one
  worked out from what it wrote and when, although its `time` field counts milliseconds;
- alice's job in vision writes `{"step": k*1e6, "time": t0+k}` under the same model: it is
  rejected (the job says why), and nothing of it is folded into any profile;
- alice's lie below the ceiling is vision's own measurement: bob's profile does not move and bob
  does not see it.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.server.helpers import job, submit, wait_for, wait_until
from tests.server.test_security import Site, pytestmark, site  # noqa: F401

#: bob's job: 40 reports, 10 steps each, half a second apart (20 steps/s), its `time` in
#: milliseconds (as JavaScript's Date.now() gives it); it prints when it wrote each.
HONEST = (
    "i=0; while [ $i -lt 40 ]; do sleep 0.5; i=$((i + 1)); "
    'printf \'{"step": %d, "time": %s}\\n\' $((i * 10)) "$(date +%s%3N)" '
    '>> "$CORRAL_PROGRESS_FILE"; echo "wrote $((i * 10)) at $(date +%s.%N)"; done'
)
#: alice's: a million steps per second of its own clock, written as fast as a shell loop goes
#: (a line every 0.2 s), then it stays.
FABRICATED = (
    "t0=$(date +%s); k=0; while [ $k -lt 15 ]; do k=$((k + 1)); "
    'printf \'{"step": %d000000, "time": %d}\\n\' $k $((t0 + k)) '
    '>> "$CORRAL_PROGRESS_FILE"; sleep 0.2; done; exec sleep 600'
)
#: alice's again: 1,000 steps every 0.2 s (about 5,000 steps/s), below the ceiling.
PLAUSIBLE = (
    "k=0; while [ $k -lt 20 ]; do k=$((k + 1)); "
    'printf \'{"step": %d}\\n\' $((k * 1000)) >> "$CORRAL_PROGRESS_FILE"; sleep 0.2; done'
)


def bert_rows(client: httpx.Client) -> list[dict[str, Any]]:
    listed = client.get("/api/v1/profiles")
    assert listed.status_code == 200, listed.text
    return [row for row in listed.json() if row["model"] == "bert-large"]


def test_one_tenants_progress_reports_do_not_move_anothers_speeds(site: Site) -> None:  # noqa: F811
    alice = site.client("alice", "vision")
    bob = site.client("bob", "nlp")
    spec = {"gpus": 1, "model": "bert-large", "total_steps": 400}

    # bob's honest job, measured on the manager's clock.
    honest = submit(bob, name="bob-bert", vc="nlp", command=HONEST, **spec)
    done = wait_for(bob, honest, timeout=180)
    assert done["status"] == "SUCCEEDED", done
    log = bob.get(f"/api/v1/jobs/{honest}/logs").text
    written = [(float(s), float(t)) for s, t in re.findall(r"wrote (\d+) at ([\d.]+)", log)]
    assert len(written) == 40, log
    (first_step, first_at), (last_step, last_at) = written[0], written[-1]
    by_hand = (last_step - first_step) / (last_at - first_at)  # about 20 steps/s
    (mine,) = bert_rows(bob)
    # The manager reads every second: each end of the span may be up to a read late, over a
    # span of about 20 s. Its own `time` (milliseconds) would make it 1,000 times slower.
    assert abs(mine["steps_per_s"] - by_hand) <= 0.2 * by_hand, (mine, by_hand)
    assert (mine["vc"], mine["gpus"], mine["runs"], mine["shared"]) == ("nlp", 1, 1, False)

    # alice fabricates a million steps per second under the same model.
    fabricated = submit(alice, name="alice-bert", vc="vision", command=FABRICATED, **spec)

    def judged() -> dict[str, Any] | None:
        found = job(alice, fabricated)
        problems = found.get("progress_problems") or {}
        progress = found.get("progress") or {}
        if problems.get("rejected") or progress.get("steps_per_s"):
            return found
        return None

    found = wait_until(judged, "alice's reports judged", timeout=120)
    rejected = found["progress_problems"]["rejected"]
    assert re.fullmatch(
        r"attempt 1: rejected: [\d.e+]+ steps/s \(step [\d.e+]+ to [\d.e+]+ in [\d.]+ s by the "
        r"manager's clock\) is above the ceiling of 100000 steps/s \(max_steps_per_s\); none of "
        r"its measurements count",
        rejected,
    ), rejected
    assert found["progress"]["steps_per_s"] is None and found["progress"]["eta_s"] is None
    assert alice.post(f"/api/v1/jobs/{fabricated}/cancel").status_code == 200
    assert wait_for(alice, fabricated, timeout=120)["status"] == "CANCELLED"
    # Nothing of it was folded in, however it ended; the reason stays among its events.
    assert bert_rows(site.admin) == [mine]
    events = [e["message"] for e in job(site.admin, fabricated)["events"]]
    assert rejected in events

    # alice lies below the ceiling: that is vision's own measurement, not bob's.
    plausible = submit(alice, name="alice-bert-2", vc="vision", command=PLAUSIBLE, **spec)
    assert wait_for(alice, plausible, timeout=120)["status"] == "SUCCEEDED"
    rows = {row["vc"]: row for row in bert_rows(site.admin)}
    assert set(rows) == {"nlp", "vision"}
    assert 1000 < rows["vision"]["steps_per_s"] < 100_000, rows["vision"]
    assert rows["nlp"] == mine  # not a digit of bob's moved
    assert bert_rows(bob) == [mine]  # and bob does not see vision's
    assert [row["vc"] for row in bert_rows(alice)] == ["vision"]
    throughput = job(bob, honest)["throughput"]
    assert [(row["vc"], row["steps_per_s"]) for row in throughput] == [("nlp", mine["steps_per_s"])]
