"""`--executor inert`: attempts that run nothing and end, exit 0, at their `time_limit`
(corral.exec.inert), for trying a policy on the real control plane and for benchmarks. Its GPUs
are declared as the local executor's are (`--gpus N`, NVML's), or a `--config`'s cluster of any
number of nodes; it needs no root, cgroups or accounts (every attempt is the manager's own)."""

from __future__ import annotations

from typing import Any

from corral.exec.inert import InertExecutor
from corral.server.executors.base import Boot, ExecutorEntry, Started
from corral.server.executors.local import config_cluster, declared_cluster, learn_gpu_memory
from corral.server.state import Executor


class InertEntry(ExecutorEntry):
    name = "inert"
    summary = "runs nothing: each attempt ends, exit 0, at its time_limit (trials, benchmarks)"
    accounts = False

    @classmethod
    def refusal(cls, options: Any, boot: Boot) -> str | None:
        if boot.demo:
            return "--executor inert: runs nothing (no --demo: the demo's jobs must run)"
        if boot.config is not None and boot.gpus is not None:
            return "--executor inert: --config's nodes are its GPUs (no --gpus with --config)"
        return None

    @classmethod
    def start(cls, options: Any, boot: Boot, given: Executor | None) -> Started:
        if boot.config is not None:
            cluster, quota, cells, tree = config_cluster(boot)  # any number of nodes
        else:
            cluster, quota, cells, tree = declared_cluster(boot)
        learn_gpu_memory(boot, cluster)
        return Started(given or InertExecutor(), cluster, quota, cells, vc_tree=tree)

    @classmethod
    def where(cls, options: Any) -> str:
        return " (inert executor: no job runs)"
