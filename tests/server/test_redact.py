"""Other jobs named in events and reasons (corral.server.redact): each phrase the manager and the
core write, with the job visible and hidden; the reader's view from the store; and a scan of the
code for text that names a job in a phrase the redactor does not know."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from corral.core.actions import Preempt
from corral.core.job import Job, JobSpec
from corral.server.auth import Principal
from corral.server.manager import Manager
from corral.server.redact import HIDDEN, for_reader, job_ids, redact
from corral.server.store import Store
from tests.server.helpers import REPO

#: (text as written, text with job 11 hidden and 12 visible)
PHRASES = [
    ("preempted by job 11", f"preempted by {HIDDEN}"),
    ("preempted by 11", f"preempted by {HIDDEN}"),  # the core's last_event
    ("migrated to make room for job 11", f"migrated to make room for {HIDDEN}"),
    (
        "unpacked from job 11: sharing its GPUs did not gain",
        f"unpacked from {HIDDEN}: sharing its GPUs did not gain",
    ),
    ("started sharing the GPUs of job 11", f"started sharing the GPUs of {HIDDEN}"),
    (
        "attempt 2 started on box/0 (0.5 of the GPU), sharing with job 11, 12",
        f"attempt 2 started on box/0 (0.5 of the GPU), sharing with job 12 and {HIDDEN}",
    ),
    ("sharing with job 11, 13", "sharing with 2 jobs of other tenants"),
    (
        "PENDING, position 2 of 4 in the queue; blocked behind job 11 (fifo without backfill)",
        f"PENDING, position 2 of 4 in the queue; blocked behind {HIDDEN} (fifo without backfill)",
    ),
    ("dependency 11 failed", f"dependency on {HIDDEN} failed"),
    (
        "dependency 11 was cancelled; never started",
        f"dependency on {HIDDEN} was cancelled; never started",
    ),
    ("dependency 12 was refused", "dependency 12 was refused"),
    ("waiting for 11, 12 to succeed", f"waiting for 12 and {HIDDEN} to succeed"),
    ("waiting for 12 to succeed", "waiting for 12 to succeed"),
    ("preempted by job 12", "preempted by job 12"),
    ("preempted by job 011", f"preempted by {HIDDEN}"),
]
#: Text that names no job: unchanged whatever is hidden.
NO_JOB = [
    "attempt 1 started on gpu-box/0, gpu-box/1",
    "array cap 10 reached",
    "PENDING, position 1 of 3 in the queue; behind higher-priority jobs",
    "held by alice",
    "shrunk from 4 to 2 GPUs by elasticflow",
    "refused: admitting it would make 1 admitted job(s) miss their deadlines",
    "attempt 1 failed (exit code 1); retry in 5 s",
    "waiting for 4 GPUs",
    "preempted by elasticflow resize",
]


def visible(job_id: str) -> bool:
    return job_id == "12"


@pytest.mark.parametrize(("text", "hidden"), PHRASES)
def test_a_hidden_job_loses_its_id_a_visible_one_keeps_it(text: str, hidden: str) -> None:
    assert redact(text, visible) == hidden
    assert redact(text, lambda job_id: True) == text
    assert job_ids(hidden) <= {"12"}


@pytest.mark.parametrize("text", NO_JOB)
def test_text_naming_no_job_is_left_alone(text: str) -> None:
    assert job_ids(text) == set()
    assert redact(text, lambda job_id: False) == text


def test_the_managers_own_words_are_redacted() -> None:
    """The manager's reasons for a stop, as it writes them (not copies of them)."""
    job = Job(spec=JobSpec(id="5", submit_time=0.0, gpus=1))
    for kind in ("preempted", "migrated", "unpacked"):
        words = Manager._stop_reason(job, Preempt("5", (0,), "11", kind=kind))
        assert job_ids(words) == {"11"}, words
        assert "11" not in redact(words, visible) and HIDDEN in redact(words, visible)


def add_job(store: Store, job_id: int, user: str, vc: str) -> None:
    store.insert_job(
        job_id,
        name="j",
        user=user,
        vc=vc,
        priority="guaranteed",
        gpus=1,
        spec={},
        submitted_at=0.0,
    )


def test_the_reader_sees_the_ids_of_the_jobs_they_may_see(tmp_path: Path) -> None:
    store = Store(Store.sqlite_url(tmp_path))
    try:
        add_job(store, 1, "alice", "a")
        add_job(store, 2, "bob", "b")
        add_job(store, 3, "carol", "b")
        texts = ["preempted by job 1", "sharing with job 2, 3", "waiting for 4 to succeed"]
        bob = Principal("bob", "b", admin=False)
        show = for_reader(store, bob, texts)
        assert [show(t) for t in texts] == [
            f"preempted by {HIDDEN}",
            "sharing with job 2, 3",  # his own, and his VC's
            f"waiting for {HIDDEN} to succeed",  # no such job: hidden as well
        ]
        alone = Principal("bob", None, admin=False)  # no VC: his own jobs only
        assert for_reader(store, alone, texts)(texts[1]) == f"sharing with job 2 and {HIDDEN}"
        admin = Principal("root", None, admin=True)
        assert [for_reader(store, admin, texts)(t) for t in texts] == texts
        assert for_reader(store, bob, [""])("") == ""
    finally:
        store.close()


# -- every text the code writes that names a job --------------------------------------------------

#: Names whose value is a job's id, where an f-string puts one into text.
ID_NAMES = {"job_id", "by", "parent", "by_job_id", "blocked_by"}
#: f-strings in corral/core and corral/server whose `{...}` the scan takes for a job id wrongly.
NOT_JOB_IDS = {
    "12345 (mode x)",  # identity.py: a directory
    "by: must be one of x (got 12345)",  # usage.py: the grouping
    "no department 12345x",  # config.py: a VC's or department's parent, a department
    "departments.12345.parent",  # config.py: the same, as the field's path
}


def names_a_job(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ID_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in ID_NAMES | {"id"}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # ", ".join(ids)
        first = node.args[0] if node.func.attr == "join" and node.args else None
        return isinstance(first, ast.Name) and first.id in ("others", "waiting")
    return False


def test_every_text_that_names_a_job_does_so_in_a_phrase_the_redactor_knows() -> None:
    """A new message that puts a job's id into text ("evicted for 11") would reach other tenants
    unredacted: each f-string of the manager and the core whose placeholder is a job id must
    name it in a phrase `job_ids` finds (errors to the caller about its own job included)."""
    scanned, unknown = 0, []
    for base in ("corral/core", "corral/server"):
        for path in sorted((REPO / base).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.JoinedStr):
                    continue
                parts, named = [], False
                for value in node.values:
                    if isinstance(value, ast.Constant):
                        parts.append(str(value.value))
                    elif isinstance(value, ast.FormattedValue) and names_a_job(value.value):
                        parts.append("12345")
                        named = True
                    else:
                        parts.append("x")
                text = "".join(parts)
                if named and text not in NOT_JOB_IDS:
                    scanned += 1
                    if "12345" not in job_ids(text):
                        unknown.append(f"{path.relative_to(REPO)}:{node.lineno}: {text}")
    assert scanned >= 20  # the scan finds the phrases above, among others
    assert not unknown, "\n".join(unknown)
