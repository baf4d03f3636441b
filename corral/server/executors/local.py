"""`--executor local`: attempts as processes on this machine (corral.exec.local), whose GPUs are
the cluster: NVML's, `--gpus N` declared ones, or a one-node `--config`."""

from __future__ import annotations

import socket
from typing import Any

from corral.core.cluster import Cluster, ClusterError, NodeDef
from corral.core.config import ConfigError, vc_gpu_quota
from corral.core.queues import QueueTree
from corral.exec.gpus import (
    NoGpusError,
    discover_gpus,
    nvml_topology,
    smallest_memory_mib,
    uniform_group_size,
)
from corral.server.executors.base import Boot, ExecutorEntry, ExecutorError, Started
from corral.server.state import Executor

#: The cluster, each VC's guaranteed GPUs and, from a config, their cells (HiveD's guarantees)
#: and their departments, weights and limits (None: flat VCs).
MachineCluster = tuple[Cluster, dict[str, int], dict[str, dict[str, int]] | None, QueueTree | None]


def node_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def config_cluster(boot: Boot) -> MachineCluster:
    """The cluster and VCs of `--config`."""
    from corral.config_file import load_cluster_config

    assert boot.config is not None
    try:
        config = load_cluster_config(boot.config)
    except ConfigError as error:
        raise ExecutorError(str(error)) from None
    return config.cluster, vc_gpu_quota(config), config.virtual_clusters, config.queues


def machine_cluster(boot: Boot) -> MachineCluster:
    """This machine as a one-node cluster (or the config's cluster, which must be one node that
    this machine's GPUs cover), the VCs' guaranteed GPUs and, from a config, their cells."""
    if boot.config is not None:
        cluster, quota, cells, tree = config_cluster(boot)
        if len(cluster.nodes) != 1:
            raise ExecutorError(
                f"{boot.config}: describes {len(cluster.nodes)} nodes; the local executor "
                "runs jobs on this one machine: give one node"
            )
        if boot.gpus is None:
            try:
                found = len(discover_gpus(None))
            except NoGpusError:
                found = cluster.total_gpus  # a machine without GPUs runs the config as declared
        else:
            found = boot.gpus
        if found < cluster.total_gpus:
            raise ExecutorError(
                f"{boot.config}: the node has {cluster.total_gpus} GPUs but this machine "
                f"has {found}"
            )
        return cluster, quota, cells, tree
    return declared_cluster(boot)


def declared_cluster(boot: Boot) -> MachineCluster:
    """One node, this machine: `--gpus N` declared GPUs, else NVML's (and the PCIe switches they
    sit under)."""
    switch_size = None
    try:
        if boot.gpus is None:
            topology = nvml_topology()
            gpus = topology.gpus
            switch_size = uniform_group_size(topology.switch_groups, len(gpus))
        else:
            gpus = discover_gpus(boot.gpus, gpu_type=boot.gpu_type)
    except NoGpusError as error:
        raise ExecutorError(str(error)) from None
    try:
        node = NodeDef(
            name=node_name(),
            gpus=len(gpus),
            gpu_type=gpus[0].gpu_type,
            gpus_per_switch=switch_size,
        )
        cluster = Cluster.from_nodes([node])
    except ClusterError as error:
        raise ExecutorError(str(error)) from None
    return cluster, {"default": cluster.total_gpus}, None, None


def learn_gpu_memory(boot: Boot, cluster: Cluster) -> None:
    """The memory of this machine's GPUs, for shares (`ManagerSettings.gpu_memory_mib`): the
    declared `--gpu-memory`, else NVML's (the smallest GPU's), else none known. Settings that
    already name it (a test's) are kept."""
    settings = boot.settings
    size = boot.gpu_memory_mib
    if size is None and not settings.gpu_memory_mib and boot.gpus is None:
        try:
            size = smallest_memory_mib(discover_gpus(None))
        except NoGpusError:  # a config run on a machine without GPUs
            size = None
    if size is not None:
        settings.gpu_memory_mib = dict.fromkeys(cluster.gpu_types, size)


class LocalEntry(ExecutorEntry):
    name = "local"
    summary = "processes on this machine, each attempt under its own supervisor and container"

    @classmethod
    def start(cls, options: Any, boot: Boot, given: Executor | None) -> Started:
        from corral.exec.local import LocalExecutor

        cluster, quota, cells, tree = machine_cluster(boot)
        learn_gpu_memory(boot, cluster)
        return Started(given or LocalExecutor(), cluster, quota, cells, vc_tree=tree)
