"""Fair share in `corral up`: real job processes (local executor), a real SQLite file, HTTP on
loopback, the real clock. VCs share the cluster by weight discounted by their recent usage
(Slurm's classic factor 2^(-U/S)): the VC that used less takes GPUs back from the one that used
more, beyond what its weight alone gives it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.server.helpers import admin_token, api, job, start_server, submit, wait_for

#: One machine of 4 GPUs; VCs `a` and `b` are guaranteed two each (so their weights are 2 and 2).
FOUR_GPUS_TWO_VCS = """\
cell_types:
  ONE: {child: gpu, count: 1}
  NODE: {child: ONE, count: 4, node: true}
physical_cells:
  - {type: NODE, count: 1}
virtual_clusters:
  a: {ONE: 2}
  b: {ONE: 2}
"""


def sleeper(name: str, vc: str, gpus: int = 1) -> dict[str, Any]:
    return {"name": name, "vc": vc, "gpus": gpus, "command": "exec sleep 3600", "grace_seconds": 1}


def test_the_vc_that_used_less_takes_back_more_than_its_weight(data_dir: Path) -> None:
    # fifo, fairshare (half-life 7 days: nothing decays within the test). By hand:
    # 1. a1..a4 (VC a, 1 GPU each) start: a alone is active, its share is the 4 GPUs. b used
    #    nothing, so from now on a's normalized usage U is 1 and b's 0, however long a runs.
    # 2. a5 (VC a, 3 GPUs) then bb (VC b, 3 GPUs) arrive. Factors 2^(-U/S), S = 2/4 = 0.5:
    #    a: 2^-2 = 0.25, b: 2^0 = 1; shares 4 x weight x factor over the active VCs' sum:
    #    a: 4 x 0.5 / 2.5 = 0.8 GPUs, b: 4 x 2 / 2.5 = 3.2 GPUs.
    # 3. a5 comes first in fifo order but a is over its share: it waits. bb's 3 GPUs are within
    #    b's 3.2, and a holds 4 > 0.8: bb takes back three of a's GPUs, from its latest jobs
    #    (a4, a3, a2). By weights alone (usage ignored) b's share would be 2: bb would wait.
    # 4. It stays so while a's share is under 2 (a's usage over half of all): b runs 3 GPUs to
    #    a's 1, so for twice as long as a ran alone.
    server = start_server(
        data_dir, gpus=4, config=FOUR_GPUS_TWO_VCS, policy="fifo", admission="fairshare"
    )
    try:
        client = api(server.url, admin_token(data_dir))
        a_jobs = [submit(client, **sleeper(f"a{n}", "a")) for n in range(1, 5)]
        for job_id in a_jobs:
            wait_for(client, job_id, ["RUNNING"])
        # a's usage grows: how much does not change the shares above, only how long b keeps
        # what it takes (twice as long as a ran alone, 6 s: the checks below take far less).
        time.sleep(3.0)
        a5 = submit(client, **sleeper("a5", "a", gpus=3))
        bb = submit(client, **sleeper("bb", "b", gpus=3))
        started = wait_for(client, bb, ["RUNNING"], timeout=60)
        assert len(started["placement"]) == 3
        with server.manager.lock:
            (fairshare,) = server.manager.scheduler.admission.members
            # (0.25 and 1 when bb started; b's usage has grown since)
            assert fairshare.factor("a") < fairshare.factor("b")
        a1, a2, a3, a4 = a_jobs
        for victim in (a2, a3, a4):
            found = job(client, victim)
            assert (found["status"], found["preemptions"]) == ("PENDING", 1)
            assert [e["message"] for e in found["events"] if e["kind"] == "preempted"] == [
                f"preempted by job {bb}"
            ]
        assert job(client, a1)["status"] == "RUNNING" and job(client, a1)["preemptions"] == 0
        found = job(client, a5)
        assert (found["status"], found["attempts"]) == ("PENDING", 0)
        for job_id in (*a_jobs, a5, bb):
            client.post(f"/api/v1/jobs/{job_id}/cancel")
        for job_id in (*a_jobs, a5, bb):
            assert wait_for(client, job_id)["status"] == "CANCELLED"
    finally:
        server.stop()
