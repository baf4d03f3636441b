"""Other jobs named in what a reader is shown: a job the reader may not see keeps no id.

Events, a job's `reason` and the scheduler's explanations name other jobs: "preempted by job 11",
"migrated to make room for job 11", "sharing with job 11, 12", "unpacked from job 11", "blocked
behind job 7", "dependency 12 failed", "waiting for 12, 13 to succeed". Most of that text is not
stored but made by the core when it is read (the queue, why a job waits), and what is stored was
written in these same words by the manager; so the ids are found in the text, when it is read,
by the phrases that name a job, and those of jobs the reader may not see (auth.can_read_job) are
replaced: "preempted by another tenant's job". Admins, and readers who may see the other job,
get the text as it is. `for_reader` is the one way the API's read paths (job summaries and
details, the queue, their reasons and events; the dashboard and the CLI read those) apply it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from corral.server import auth
from corral.server.auth import Principal
from corral.server.store import Store

#: What a hidden job is called instead of "job 11".
HIDDEN = "another tenant's job"
_IDS = r"\d{1,12}(?:, \d{1,12})*"
#: The phrases that name jobs by id: "job 11" ("job 11, 12"), "dependency 12", the core's
#: "preempted by 12", "waiting for 12, 13 to succeed".
REFERENCE = re.compile(
    rf"\b(?P<lead>jobs? |dependency |preempted by )(?P<ids>{_IDS})\b"
    rf"|\b(?P<wait>waiting for )(?P<waited>{_IDS})(?= to succeed\b)"
)


def job_ids(text: str) -> set[str]:
    """The ids of the jobs `text` names (as stored: no leading zeros)."""
    found: set[str] = set()
    for match in REFERENCE.finditer(text):
        ids = match["ids"] or match["waited"]
        found.update(str(int(job_id)) for job_id in ids.split(", "))
    return found


def redact(text: str, visible: Callable[[str], bool]) -> str:
    """`text` with every job that `visible(id)` refuses named without its id."""

    def replace(match: re.Match[str]) -> str:
        lead = match["lead"] or match["wait"]
        ids = (match["ids"] or match["waited"]).split(", ")
        shown = [job_id for job_id in ids if visible(str(int(job_id)))]
        hidden = len(ids) - len(shown)
        if not hidden:
            return match[0]
        parts = []
        if shown:
            prefix = "" if lead in ("dependency ", "waiting for ", "preempted by ") else lead
            parts.append(prefix + ", ".join(shown))
        parts.append(HIDDEN if hidden == 1 else f"{hidden} jobs of other tenants")
        if lead == "dependency ":
            lead = "dependency on "
        elif lead.startswith("job"):
            lead = ""
        return lead + " and ".join(parts)

    return REFERENCE.sub(replace, text)


def _unchanged(text: str) -> str:
    return text


def for_reader(store: Store, who: Principal, texts: Iterable[str]) -> Callable[[str], str]:
    """What `who` is shown of each of `texts` (and of other text naming only the same jobs):
    the jobs it names that `who` may not see, without their ids. One query, by id, for all the
    jobs named; none for an admin or text that names no job."""
    if who.admin:
        return _unchanged
    named: set[str] = set()
    for text in texts:
        if text:
            named |= job_ids(text)
    if not named:
        return _unchanged
    visible = {row.id for row in store.list_jobs(ids=named, visible_to=auth.visible_to(who))}
    return lambda text: redact(text, visible.__contains__) if text else text
