"""The scheduling core: pure (no I/O, no clock), shared by the simulator and the live manager."""

from corral.core.actions import Action, Decision, Preempt, Start
from corral.core.cluster import Cell, Cluster, ClusterError, NodeDef
from corral.core.job import Job, JobSpec, JobStatus, Priority
from corral.core.refusal import JobRefused
from corral.core.scheduler import Scheduler

__all__ = [
    "Action",
    "Cell",
    "Cluster",
    "ClusterError",
    "Decision",
    "Job",
    "JobRefused",
    "JobSpec",
    "JobStatus",
    "NodeDef",
    "Preempt",
    "Priority",
    "Scheduler",
    "Start",
]
