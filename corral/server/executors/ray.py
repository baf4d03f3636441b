"""`--executor ray`: attempts as Ray actors on a Ray cluster's GPU nodes (corral.exec.ray, imported
only when this executor starts), whose nodes are the cluster: read again as they come and go,
or, with hived, the config's cells naming them."""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from corral.core.cluster import Cluster, NodeDef
from corral.core.framework import STAGES
from corral.core.options import option
from corral.core.queues import QueueTree
from corral.exec.shim import write_json_atomic
from corral.server.executors.base import Boot, ExecutorEntry, ExecutorError, Started
from corral.server.executors.local import config_cluster
from corral.server.state import Executor

if TYPE_CHECKING:
    from corral.exec.ray import RayExecutor

log = logging.getLogger("corral.boot")


@dataclass(frozen=True, slots=True)
class RayOptions:
    address: str | None = option(
        None, help="the Ray head's HOST:PORT (as for `ray start --address`)"
    )


def ray_node_defs(executor: RayExecutor) -> list[NodeDef]:
    return [
        NodeDef(name=node.name, gpus=node.gpus, gpu_type=node.gpu_type, rack=node.rack)
        for node in executor.nodes()
    ]


def ray_namespace(data_dir: Path) -> str:
    """This manager's Ray namespace, made once per data dir: the actors it finds again after a
    restart are its own, never those of another manager of the same Ray cluster."""
    path = data_dir / "ray-namespace"
    if not path.exists():
        write_json_atomic(path, {"namespace": f"corral-{uuid.uuid4().hex[:12]}"}, durable=True)
    path.chmod(0o600)  # for the manager alone (also when an older version made it)
    return str(json.loads(path.read_text())["namespace"])


#: The `meta` key of the Ray namespace that managers sharing a database share (docs/ha.md): a
#: standby that takes over finds the previous leader's actors in it.
NAMESPACE_KEY = "ray_namespace"


def connect_ray(
    address: str, data_dir: Path, shared: Callable[[str, str], str] | None = None
) -> RayExecutor:
    try:
        from corral.exec.ray import RayExecutor, access_problem
    except ImportError:
        raise ExecutorError(
            "--executor ray: Ray is not installed (pip install 'corral[ray]')"
        ) from None
    host, _, port = address.rpartition(":")
    try:  # Ray itself would retry for minutes before it says so
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise ExecutorError(
            f"--ray-address {address}: no Ray head answers there ({error.strerror or error})"
        ) from None
    problem = access_problem(address)
    if problem is not None:
        raise ExecutorError(f"--ray-address {address}: {problem}")
    namespace = ray_namespace(data_dir)
    if shared is not None:
        namespace = shared(NAMESPACE_KEY, namespace)
    try:
        return RayExecutor(address, namespace)
    except (ConnectionError, RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ExecutorError(f"--ray-address {address}: cannot connect ({first})") from None


def build_ray_cluster(
    address: str, boot: Boot, executor: RayExecutor
) -> tuple[
    Cluster, dict[str, int] | None, dict[str, dict[str, int]] | None, bool, QueueTree | None
]:
    """The core's cluster on Ray, the VCs' guaranteed GPUs and cells, whether the cluster is
    fixed, and the VCs' departments (None: flat). Without hived: the Ray nodes that declare GPUs (rebuilt as they come and go); the
    config, if any, gives the VCs. With hived: the config's cluster itself, whose physical cells
    name the Ray nodes (`corral-node-NAME`): HiveD binds VCs to cells of a fixed topology, so a
    node that is missing is held out of allocation until it joins, never rebuilt away."""
    hived = boot.settings.scheduler.core.admission[0] == "hived"
    if hived and boot.config is None:
        raise ExecutorError(
            "--admission hived: needs --config FILE whose physical cells name the Ray nodes "
            "(their corral-node-NAME resources)"
        )
    nodes = ray_node_defs(executor)
    if not nodes and not hived:
        raise ExecutorError(
            f"--ray-address {address}: no node declares GPUs "
            "(start them with `ray start --num-gpus=N`)"
        )
    if boot.config is None:
        return Cluster.from_nodes(nodes), None, None, False, None
    cluster, quota, cells, tree = config_cluster(boot)
    if not hived:
        return Cluster.from_nodes(nodes), quota, None, False, tree
    named = {node.name for node in cluster.nodes}
    if not named & {node.name for node in nodes}:
        log.warning(
            "no Ray node is one of %s's nodes (%s) yet: nothing starts until one joins",
            boot.config,
            ", ".join(sorted(named)),
        )
    return cluster, quota, cells, True, tree


class RayEntry(ExecutorEntry):
    name = "ray"
    summary = "Ray actors on a Ray cluster's GPU nodes (--ray-address)"
    Options = RayOptions

    @classmethod
    def refusal(cls, options: Any, boot: Boot) -> str | None:
        address = options.address
        if not address:
            return "--executor ray: needs --ray-address HOST:PORT (the Ray head's address)"
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            return f"--ray-address {address}: expected HOST:PORT"
        if boot.demo or boot.gpus is not None:
            return "--executor ray: the GPUs are the Ray nodes' (no --gpus, no --demo)"
        if boot.gpu_memory_mib is not None:
            return "--gpu-memory: the local executor's GPUs only (the Ray executor runs no shares)"
        stages = boot.settings.scheduler.core.stages
        sharing = [name for name in stages if name in STAGES and STAGES[name].shares_gpus]
        if sharing:
            # Ray gives each GPU to one actor: a guest's workers would never be scheduled.
            return (
                f"--stages {sharing[0]}: runs with the local executor only (the stage lets "
                "jobs share GPUs; Ray lets one actor hold a GPU)"
            )
        return None

    @classmethod
    def start(cls, options: Any, boot: Boot, given: Executor | None) -> Started:
        # Given one (tests), it is a RayExecutor already connected.
        if given is not None:
            executor = cast("RayExecutor", given)
        else:
            executor = connect_ray(options.address, boot.data_dir, boot.shared)
        try:
            cluster, quota, cells, fixed, tree = build_ray_cluster(options.address, boot, executor)
        except BaseException:
            executor.close()
            raise
        nodes = partial(ray_node_defs, executor)
        return Started(
            executor, cluster, quota, cells, vc_tree=tree, nodes=nodes, fixed_cluster=fixed
        )

    @classmethod
    def prepare(
        cls, options: Any, boot: Boot, recorded: Callable[[str], str | None]
    ) -> Executor | None:
        # Connecting (`ray.init`) is most of a takeover on Ray: a standby connects while it
        # waits, in the namespace the leader recorded (if it has not yet: at the takeover).
        namespace = recorded(NAMESPACE_KEY)
        if namespace is None:
            return None
        try:
            return connect_ray(options.address, boot.data_dir, lambda key, mine: namespace)
        except ExecutorError as error:
            log.warning("standby: not connected to Ray yet (%s); connecting when it leads", error)
            return None

    @classmethod
    def where(cls, options: Any) -> str:
        return f" of the Ray cluster at {options.address}"
