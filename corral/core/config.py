"""The cluster and its virtual clusters (VCs), parsed from an already-loaded mapping (e.g. YAML).

Pure: no file I/O (``corral.config_file`` reads files). The format::

    cell_types:
      V100-2GPU: {child: V100, count: 2}             # a PCIe-switch pair
      V100-NODE: {child: V100-2GPU, count: 4, node: true}
      V100-RACK: {child: V100-NODE, count: 4}
    physical_cells:
      - {type: V100-RACK, count: 2}                  # generated names: V100-RACK-0, V100-RACK-1
      - {type: V100-NODE, names: [gpu-a, gpu-b]}     # or one given name per cell
    virtual_clusters:
      vision: {V100-NODE: 3, V100-2GPU: 1}
      nlp: {V100-RACK: 1}

Rules (each violation is a ConfigError whose message starts with the offending key path):

- A cell type is ``count`` cells of its ``child``. A child that no cell type defines is a GPU type,
  stored lowercase (``V100`` -> ``v100``); a child equal to a cell type but for case is refused.
  Cell types may not form a cycle. Every count is a positive integer (``true`` is not one).
- Node level. A chain runs from a cell type that is no other type's child down to the GPUs. If no
  cell type is marked ``node: true``, the type directly above the GPUs is the node in every chain.
  Once any type is marked, every chain must contain exactly one marked type (so a misspelt child,
  which would silently become a GPU type, is caught); two marked types in one chain are refused.
- ``physical_cells`` is a non-empty list of top-level cells, each a node or above (a type inside a
  node is refused), with either ``count`` or ``names`` (one name per cell; names may not contain
  "/" and may be used only once). A cell above node level is the rack of the nodes directly under
  it (Cluster: a node's parent is its rack unless it is the root); a node-level physical cell sits
  under the root and is its own rack.
- Cell names: a top-level cell is its given name or ``<TYPE>-<i>`` (i counts per type over all
  entries); a cell inside it is ``<parent>/<TYPE>-<j>`` (j counts within the parent); a GPU is
  ``<node>/gpu<k>`` (k counts within the node).
- ``virtual_clusters`` maps a VC name to ``{cell type: count}``; GPU types cannot be given to a VC.
  The VCs together must fit in the cluster: going from the biggest cell types down, the cells of a
  type available to VCs are the physical ones plus those inside the bigger cells no VC was given;
  asking for more is refused, naming the type, the total asked and the number available.
- ``maintenance`` (the simulator's): a list of ``{node, start, end, reason, preempt}``, a node
  drained from ``start`` to ``end`` (seconds on the simulation's clock; no ``end``: to the end of
  the run), its attempts preempted at ``start`` with ``preempt: true`` (docs/simulator.md). The
  node must be one of the cluster's (a node-level cell's name) and ``end`` after ``start``.
- ``health_check`` (the live manager's, `corral up`): ``{command, every_s, timeout_s, nvml}``, a
  site's health-check command run for each node every ``every_s`` seconds (default 30) with a
  ``timeout_s`` (default 10), and whether NVML's signals are read (docs/server.md, "Nodes");
  `corral up --health-check` and its flags override it.
- A VC may also be written ``{cells: {...}, parent: DEPT, weight: W, limit: L}`` (hierarchical
  queues, corral.core.queues): ``parent`` names an entry of ``departments``, ``weight`` (a
  positive number, 1 by default) is its part of what its parent leaves over, ``limit`` (GPUs, at
  least its quota) the most it may use. ``departments`` maps a department to ``{quota, weight,
  limit, parent}`` (``quota`` in GPUs, by default its children's together). A parent that is not
  a department, a cycle of departments, a department nobody names, children whose quotas sum over
  their department's, a limit below the quota and top-level quotas over the cluster's GPUs are
  refused, naming the queue and the field.
- ``reservations``: a list of ``{name, start, duration, gpus | nodes, users, vcs}``, GPUs
  claimed from ``start`` for ``duration`` seconds (the simulation's clock) for those users and
  VCs (none: a maintenance window): ``gpus`` a count (whole nodes first, from the last node
  back, none another reservation of an overlapping window claims) or ``nodes`` a list of the
  cluster's nodes (corral.core.reservations).
- No ``virtual_clusters`` (or an empty mapping) gives one VC, ``default``, the whole cluster: it is
  returned as ``{"default": {}}``; an empty cell map means "the whole cluster" and only arises so.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Annotated

from pydantic import BaseModel, ConfigDict, PlainValidator, StrictBool, ValidationError
from pydantic_core import PydanticCustomError

from corral.core.cluster import Cell, Cluster, ClusterError
from corral.core.configerror import ConfigError as ConfigError
from corral.core.nodes import NodeChange, maintenance_changes
from corral.core.queues import Queue, QueueTree
from corral.core.reservations import Reservation, ReservationError, choose_gpus

DEFAULT_VC = "default"
# Counts that would build a bigger tree are a typo, not a cluster: refuse them before building.
MAX_GPUS = 1_000_000


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    cluster: Cluster
    virtual_clusters: dict[str, dict[str, int]]  # VC -> {cell type: count}; {} = whole cluster
    #: The simulator's maintenance windows as drains and resumes, in time order (`maintenance`).
    maintenance: tuple[NodeChange, ...] = ()
    #: The live manager's health checks (`health_check`); None: none.
    health_check: HealthCheckConfig | None = None
    #: The VCs' departments, weights and limits (`departments`, a VC's `parent`, `weight`,
    #: `limit`); None: the VCs are flat, as without those keys.
    queues: QueueTree | None = None
    #: GPUs claimed over time windows for some users or VCs (`reservations`).
    reservations: tuple[Reservation, ...] = ()


@dataclass(frozen=True, slots=True)
class HealthCheckConfig:
    """A config's `health_check:` section (corral.server.health runs it)."""

    command: str | None = None
    every_s: float = 30.0
    timeout_s: float = 10.0
    nvml: bool = False


# -- shape (pydantic) ---------------------------------------------------------------------------


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PydanticCustomError(
            "positive_int", "must be a positive integer, got {got}", {"got": _show(value)}
        )
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("string", "must be a string, got {got}", {"got": _show(value)})
    if not value.strip():
        raise PydanticCustomError("empty", "must not be empty")
    return value


def _cell_name(value: object) -> str:
    text = _text(value)
    if "/" in text:
        raise PydanticCustomError(
            "slash",
            "must not contain '/' (it separates the levels of cell names), got {got}",
            {"got": _show(value)},
        )
    return text


Count = Annotated[int, PlainValidator(_positive_int)]
CellName = Annotated[str, PlainValidator(_cell_name)]
VcName = Annotated[str, PlainValidator(_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CellTypeSpec(_Strict):
    child: CellName
    count: Count
    node: StrictBool = False


class PhysicalCellSpec(_Strict):
    type: CellName
    count: Count | None = None
    names: list[CellName] | None = None


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise PydanticCustomError(
            "seconds", "must be a number of seconds >= 0, got {got}", {"got": _show(value)}
        )
    if value == float("inf"):
        raise PydanticCustomError("seconds", "must be finite, got {got}", {"got": _show(value)})
    return float(value)


Seconds = Annotated[float, PlainValidator(_seconds)]


class MaintenanceSpec(_Strict):
    """A node drained from `start` to `end` (seconds on the simulation's clock; no end: drained
    to the end of the run), its attempts preempted at the start with `preempt`."""

    node: VcName
    start: Seconds
    end: Seconds | None = None
    reason: VcName = "maintenance"
    preempt: StrictBool = False


class HealthCheckSpec(_Strict):
    """The live manager's health checks of its nodes (corral.server.health)."""

    command: VcName | None = None
    every_s: Seconds = 30.0
    timeout_s: Seconds = 10.0
    nvml: StrictBool = False


def _weight(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value < float("inf")
    ):
        raise PydanticCustomError(
            "weight", "must be a positive number, got {got}", {"got": _show(value)}
        )
    return float(value)


Weight = Annotated[float, PlainValidator(_weight)]


class QueueSpec(_Strict):
    """A VC's place in the tree of queues (its long form's keys besides `cells`)."""

    parent: VcName | None = None
    weight: Weight = 1.0
    limit: Count | None = None


class DepartmentSpec(QueueSpec):
    quota: Count | None = None


class ReservationSpec(_Strict):
    """GPUs (a count, or whole nodes) claimed from `start` for `duration` seconds for some users
    or VCs (none: no one, a maintenance window)."""

    name: VcName
    start: Seconds
    duration: Seconds
    gpus: Count | None = None
    nodes: list[VcName] | None = None
    users: list[VcName] | None = None
    vcs: list[VcName] | None = None


class ClusterConfigSpec(_Strict):
    cell_types: dict[CellName, CellTypeSpec]
    physical_cells: list[PhysicalCellSpec]
    virtual_clusters: dict[VcName, dict[CellName, Count]] | None = None
    departments: dict[VcName, DepartmentSpec] | None = None
    maintenance: list[MaintenanceSpec] | None = None
    health_check: HealthCheckSpec | None = None
    reservations: list[ReservationSpec] | None = None


_SHAPE_ERRORS = {
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "bool_type": "must be true or false",
}


def _from_validation_error(
    error: ValidationError,
    places: dict[str, dict[object, object]] | None = None,
    under: list[int | str] | None = None,
) -> ConfigError:
    """The first error as a ConfigError; `places`: the VCs written in the long form (their
    cells' errors are under `cells`); `under`: where the validated mapping sits."""
    first = error.errors(include_url=False)[0]
    loc = [*(under or []), *first["loc"]]
    if len(loc) >= 3 and loc[0] == "virtual_clusters" and places and loc[1] in places:
        loc.insert(2, "cells")
    kind = first["type"]
    reason = first["msg"]
    if kind == "extra_forbidden":
        reason = f"unknown key (expected one of: {', '.join(_allowed_keys(loc[:-1]))})"
    elif kind == "missing":
        reason = "required key is missing"
    elif kind in _SHAPE_ERRORS:
        reason = f"{_SHAPE_ERRORS[kind]}, got {_show(first['input'])}"
    elif reason[:1].isupper() and reason[1:2].islower():
        reason = reason[0].lower() + reason[1:]
    if loc and loc[-1] == "[key]":
        loc.pop()
        reason = f"invalid name: {reason}"
    return ConfigError(".".join(str(part) for part in loc), reason)


def _allowed_keys(parent: list[int | str]) -> list[str]:
    model: type[BaseModel] = ClusterConfigSpec
    if len(parent) == 2 and parent[0] == "cell_types":
        model = CellTypeSpec
    elif len(parent) == 2 and parent[0] == "physical_cells":
        model = PhysicalCellSpec
    elif len(parent) == 2 and parent[0] == "maintenance":
        model = MaintenanceSpec
    elif len(parent) == 1 and parent[0] == "health_check":
        model = HealthCheckSpec
    elif len(parent) == 2 and parent[0] == "departments":
        model = DepartmentSpec
    elif len(parent) == 2 and parent[0] == "virtual_clusters":
        return ["cells", *QueueSpec.model_fields]
    elif len(parent) == 2 and parent[0] == "reservations":
        model = ReservationSpec
    return list(model.model_fields)


# -- semantics ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TypeInfo:
    gpu_type: str  # lowercase
    gpu_leaf: str  # the GPU type as written in the config
    gpus: int  # GPUs in one cell of this type
    height: int  # levels down to the GPUs: 1 when the child is a GPU


def _hint(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_children(types: dict[str, CellTypeSpec]) -> None:
    by_folded = {name.casefold(): name for name in types}
    for name, spec in types.items():
        if spec.child not in types and spec.child.casefold() in by_folded:
            raise ConfigError(
                f"cell_types.{name}.child",
                f"unknown cell type {spec.child!r} (did you mean "
                f"{by_folded[spec.child.casefold()]!r}? names are case-sensitive)",
            )


def _check_cycles(types: dict[str, CellTypeSpec]) -> None:
    done: set[str] = set()
    for start in types:
        path: list[str] = []
        on_path: set[str] = set()
        current = start
        while current in types and current not in done:
            if current in on_path:
                cycle = path[path.index(current) :]
                first = min(cycle, key=list(types).index)  # report from the earliest-defined member
                at = cycle.index(first)
                cycle = cycle[at:] + cycle[:at]
                raise ConfigError(
                    f"cell_types.{first}.child",
                    f"cell types form a cycle: {' > '.join([*cycle, first])}",
                )
            path.append(current)
            on_path.add(current)
            current = types[current].child
        done.update(path)


def _type_infos(types: dict[str, CellTypeSpec]) -> dict[str, _TypeInfo]:
    infos: dict[str, _TypeInfo] = {}

    def info(name: str) -> _TypeInfo:
        known = infos.get(name)
        if known is None:
            spec = types[name]
            if spec.child in types:
                below = info(spec.child)
                known = _TypeInfo(
                    below.gpu_type, below.gpu_leaf, below.gpus * spec.count, below.height + 1
                )
            else:
                known = _TypeInfo(spec.child.lower(), spec.child, spec.count, 1)
            infos[name] = known
        return known

    for name in types:
        info(name)
    return infos


def _chain(types: dict[str, CellTypeSpec], top: str) -> list[str]:
    chain = [top]
    while types[chain[-1]].child in types:
        chain.append(types[chain[-1]].child)
    return chain


def _node_types(types: dict[str, CellTypeSpec], infos: dict[str, _TypeInfo]) -> set[str]:
    marked = {name for name, spec in types.items() if spec.node}
    if not marked:
        return {name for name, info in infos.items() if info.height == 1}
    children = {spec.child for spec in types.values()}
    for top in (name for name in types if name not in children):
        chain = _chain(types, top)
        shown = " > ".join([*chain, infos[top].gpu_leaf])
        nodes = [name for name in chain if name in marked]
        if len(nodes) > 1:
            raise ConfigError(
                f"cell_types.{nodes[0]}.node",
                f"the chain {shown} has {len(nodes)} node levels ({', '.join(nodes)}); "
                "mark only one",
            )
        if not nodes:
            leaf = infos[top].gpu_leaf
            hint = _hint(leaf, list(types))
            if hint:
                raise ConfigError(
                    f"cell_types.{chain[-1]}.child",
                    f"unknown cell type {leaf!r}{hint}: as a GPU type it leaves the chain "
                    f"{shown} without a node level",
                )
            raise ConfigError(
                f"cell_types.{top}",
                f"no level of the chain {shown} is marked node: true; once any cell type is "
                "marked, every chain needs exactly one",
            )
    return marked


def _inside_nodes(types: dict[str, CellTypeSpec], nodes: set[str]) -> dict[str, str]:
    """Cell types that sit inside a node type -> that node type."""
    inside: dict[str, str] = {}
    for node in nodes:
        child = types[node].child
        while child in types:
            inside[child] = node
            child = types[child].child
    return inside


def _unknown_type(
    name: str, types: dict[str, CellTypeSpec], infos: dict[str, _TypeInfo], given_to: str
) -> str:
    if name.lower() in {info.gpu_type for info in infos.values()}:
        return f"unknown cell type {name!r}: it is a GPU type, and {given_to}"
    return f"unknown cell type {name!r}{_hint(name, list(types))}"


def _physical_cells(
    spec: ClusterConfigSpec, infos: dict[str, _TypeInfo], inside: dict[str, str]
) -> tuple[list[tuple[str, str]], Counter[str]]:
    """The top-level cells as (cell type, name), and how many there are of each type."""
    types = spec.cell_types
    if not spec.physical_cells:
        raise ConfigError("physical_cells", "must list at least one cell")
    counts: Counter[str] = Counter()
    explicit: dict[str, str] = {}  # given name -> its key path
    for i, entry in enumerate(spec.physical_cells):
        at = f"physical_cells.{i}"
        if entry.type not in types:
            raise ConfigError(
                f"{at}.type",
                _unknown_type(
                    entry.type, types, infos, "a physical cell must be a node or contain nodes"
                ),
            )
        if entry.type in inside:
            raise ConfigError(
                f"{at}.type",
                f"{entry.type} is below node level (it sits inside {inside[entry.type]}); "
                "a physical cell must be a node or contain nodes",
            )
        if (entry.count is None) == (entry.names is None):
            raise ConfigError(at, "give either count (how many cells) or names (one per cell)")
        if entry.names is not None:
            if not entry.names:
                raise ConfigError(f"{at}.names", "must list at least one name")
            for j, name in enumerate(entry.names):
                if name in explicit:
                    raise ConfigError(
                        f"{at}.names.{j}",
                        f"name {name!r} is listed twice (also at {explicit[name]})",
                    )
                explicit[name] = f"{at}.names.{j}"
        counts[entry.type] += entry.count if entry.count is not None else len(entry.names or ())
    total_gpus = sum(infos[name].gpus * count for name, count in counts.items())
    if total_gpus > MAX_GPUS:
        raise ConfigError(
            "physical_cells",
            f"the cluster would have {total_gpus} GPUs, more than the limit of "
            f"{MAX_GPUS}; check the counts",
        )
    cells: list[tuple[str, str]] = []
    generated: Counter[str] = Counter()
    for i, entry in enumerate(spec.physical_cells):
        if entry.names is not None:
            cells.extend((entry.type, name) for name in entry.names)
            continue
        for _ in range(entry.count or 0):
            name = f"{entry.type}-{generated[entry.type]}"
            generated[entry.type] += 1
            if name in explicit:
                raise ConfigError(
                    explicit[name],
                    f"name {name!r} is also the generated name of a cell of "
                    f"physical_cells.{i}; pick another",
                )
            cells.append((entry.type, name))
    return cells, counts


def _virtual_clusters(
    spec: ClusterConfigSpec, infos: dict[str, _TypeInfo], physical: Counter[str]
) -> dict[str, dict[str, int]]:
    types = spec.cell_types
    if not spec.virtual_clusters:
        return {DEFAULT_VC: {}}
    asked: dict[str, list[tuple[str, int]]] = {}  # cell type -> [(vc, count)] in config order
    for vc, cells in spec.virtual_clusters.items():
        if not cells:
            raise ConfigError(
                f"virtual_clusters.{vc}",
                "a VC must be given at least one cell (leave virtual_clusters out "
                f"to give the whole cluster to one {DEFAULT_VC!r} VC)",
            )
        for cell_type, count in cells.items():
            if cell_type not in types:
                raise ConfigError(
                    f"virtual_clusters.{vc}.{cell_type}",
                    _unknown_type(cell_type, types, infos, "a VC is given cells"),
                )
            asked.setdefault(cell_type, []).append((vc, count))
    # Biggest types first: a cell given whole to a VC is not split for the smaller types below it.
    existing: Counter[str] = Counter(physical)
    available: Counter[str] = Counter(physical)
    for name in sorted(types, key=lambda t: -infos[t].height):
        asks = asked.get(name, [])
        total = sum(count for _, count in asks)
        if total > available[name]:
            running, culprit = 0, asks[-1][0]
            for vc, count in asks:
                running += count
                if running > available[name]:
                    culprit = vc
                    break
            detail = ", ".join(f"{vc} {count}" for vc, count in asks)
            if available[name] == existing[name]:
                has = f"the cluster has {existing[name]}"
            else:
                has = (
                    f"only {available[name]} of the cluster's {existing[name]} are left outside "
                    "the bigger cells given to VCs"
                )
            raise ConfigError(
                f"virtual_clusters.{culprit}.{name}",
                f"the VCs ask for {total} {name} cells in all ({detail}) but {has}",
            )
        child = types[name].child
        if child in types:
            existing[child] += existing[name] * types[name].count
            available[child] += (available[name] - total) * types[name].count
    return {vc: dict(cells) for vc, cells in spec.virtual_clusters.items()}


def _build_tree(
    types: dict[str, CellTypeSpec],
    infos: dict[str, _TypeInfo],
    nodes: set[str],
    cells: list[tuple[str, str]],
) -> Cell:
    root = Cell(name="cluster", cell_type="cluster", gpu_type="")
    node_name = ""
    next_gpu = 0

    def build(cell_type: str, name: str) -> Cell:
        nonlocal node_name, next_gpu
        spec = types[cell_type]
        info = infos[cell_type]
        cell = Cell(
            name=name, cell_type=cell_type, gpu_type=info.gpu_type, is_node=cell_type in nodes
        )
        if cell.is_node:
            node_name, next_gpu = name, 0
        if spec.child in types:
            cell.children = [
                build(spec.child, f"{name}/{spec.child}-{j}") for j in range(spec.count)
            ]
        else:
            first = next_gpu
            next_gpu += spec.count
            cell.children = [
                Cell(name=f"{node_name}/gpu{k}", cell_type=info.gpu_type, gpu_type=info.gpu_type)
                for k in range(first, next_gpu)
            ]
        return cell

    root.children = [build(cell_type, name) for cell_type, name in cells]
    return root


def parse_cluster_config(data: object) -> ClusterConfig:
    """Validate a loaded config (see the module docstring) and build its cluster; ConfigError if
    it is refused."""
    if data is None:
        raise ConfigError("", "the config is empty")
    if not isinstance(data, dict):
        raise ConfigError(
            "",
            "the config must be a mapping with the keys cell_types, "
            f"physical_cells and virtual_clusters, got {type(data).__name__}",
        )
    data, places = _split_long_vcs(data)
    try:
        spec = ClusterConfigSpec.model_validate(data)
    except ValidationError as error:
        raise _from_validation_error(error, places) from None
    queue_specs: dict[str, QueueSpec] = {}
    for vc, place in places.items():
        try:
            queue_specs[vc] = QueueSpec.model_validate(place)
        except ValidationError as error:
            raise _from_validation_error(error, under=["virtual_clusters", vc]) from None
    types = spec.cell_types
    if not types:
        raise ConfigError("cell_types", "must define at least one cell type")
    _check_children(types)
    _check_cycles(types)
    infos = _type_infos(types)
    nodes = _node_types(types, infos)
    cells, physical = _physical_cells(spec, infos, _inside_nodes(types, nodes))
    try:
        virtual_clusters = _virtual_clusters(spec, infos, physical)
    except ConfigError as error:  # a VC in the long form has its cells under `cells`
        head, vc, rest = (error.key_path.split(".", 2) + ["", ""])[:3]
        if head != "virtual_clusters" or vc not in places or not rest:
            raise
        raise ConfigError(f"virtual_clusters.{vc}.cells.{rest}", error.reason) from None
    try:
        cluster = Cluster(_build_tree(types, infos, nodes, cells))
    except ClusterError as error:  # the checks above should make this unreachable
        raise ConfigError("physical_cells", str(error)) from None
    maintenance = _maintenance(spec.maintenance or [], cluster)
    health = None
    if spec.health_check is not None:
        check = spec.health_check
        for key in ("every_s", "timeout_s"):
            if not getattr(check, key) > 0:
                raise ConfigError(f"health_check.{key}", "must be a positive number of seconds")
        health = HealthCheckConfig(check.command, check.every_s, check.timeout_s, check.nvml)
    config = ClusterConfig(
        cluster=cluster,
        virtual_clusters=virtual_clusters,
        maintenance=maintenance,
        health_check=health,
        reservations=_reservations(spec.reservations or [], cluster),
    )
    if not places and not spec.departments:
        return config
    tree = _queue_tree(queue_specs, spec.departments or {}, vc_gpu_quota(config), cluster)
    return replace(config, queues=tree)


#: The keys of a VC's long form besides its cells.
_QUEUE_KEYS = ("parent", "weight", "limit")


def _split_long_vcs(
    data: dict[object, object],
) -> tuple[dict[object, object], dict[str, dict[object, object]]]:
    """The config with each VC written in the long form (`{cells: ..., parent: ...}`) replaced
    by its cells, and the other keys of each such VC."""
    vcs = data.get("virtual_clusters")
    if not isinstance(vcs, dict):
        return data, {}
    places: dict[str, dict[object, object]] = {}
    flat: dict[object, object] = {}
    for vc, entry in vcs.items():
        if isinstance(entry, dict) and "cells" in entry and isinstance(vc, str):
            places[vc] = {k: v for k, v in entry.items() if k != "cells"}
            flat[vc] = entry["cells"]
        else:
            flat[vc] = entry
    if not places:
        return data, {}
    return {**data, "virtual_clusters": flat}, places


def _queue_tree(
    places: dict[str, QueueSpec],
    departments: dict[str, DepartmentSpec],
    vc_quota: dict[str, int],
    cluster: Cluster,
) -> QueueTree:
    """The VCs and departments as a tree of queues, every rule of the module docstring checked."""
    for name in departments:
        if name in vc_quota:
            raise ConfigError(f"departments.{name}", f"{name!r} is also a VC; name it otherwise")
    specs: dict[str, tuple[str, QueueSpec]] = {}  # name -> (its key path, its spec)
    for vc in vc_quota:
        specs[vc] = (f"virtual_clusters.{vc}", places.get(vc, QueueSpec()))
    for name, dept in departments.items():
        specs[name] = (f"departments.{name}", dept)
    for path, spec in specs.values():
        if spec.parent is not None and spec.parent not in departments:
            hint = _hint(spec.parent, list(departments))
            known = ", ".join(departments) or "none are declared"
            raise ConfigError(
                f"{path}.parent",
                f"no department {spec.parent!r}{hint or f' (departments: {known})'}",
            )
    for name in departments:
        seen = [name]
        parent = departments[name].parent
        while parent is not None:
            if parent in seen:  # named by the first of the cycle met
                cycle = " -> ".join([*seen[seen.index(parent) :], parent])
                raise ConfigError(
                    f"departments.{parent}.parent", f"a cycle of departments: {cycle}"
                )
            seen.append(parent)
            parent = departments[parent].parent
    children: dict[str, list[str]] = {name: [] for name in departments}
    for name, (_, spec) in specs.items():
        if spec.parent is not None:
            children[spec.parent].append(name)
    quota: dict[str, int] = dict(vc_quota)

    def quota_of(name: str) -> int:
        if name not in quota:
            below = sum(quota_of(child) for child in children[name])
            given = departments[name].quota
            quota[name] = below if given is None else given
        return quota[name]

    for name in departments:
        if not children[name]:
            raise ConfigError(f"departments.{name}", "no VC or department names it as its parent")
        below = {child: quota_of(child) for child in children[name]}
        if quota_of(name) < sum(below.values()):
            detail = ", ".join(f"{child} {gpus}" for child, gpus in below.items())
            raise ConfigError(
                f"departments.{name}.quota",
                f"its children's quotas sum to {sum(below.values())} GPUs ({detail}), over its "
                f"quota of {quota_of(name)}",
            )
    for name, (path, spec) in specs.items():
        if spec.limit is not None and spec.limit < quota_of(name):
            raise ConfigError(
                f"{path}.limit", f"{spec.limit} GPUs is below its quota of {quota_of(name)}"
            )
    top = {name: quota_of(name) for name, (_, spec) in specs.items() if spec.parent is None}
    if sum(top.values()) > cluster.total_gpus:
        culprit = next(name for name in top if name in departments) if departments else ""
        detail = ", ".join(f"{name} {gpus}" for name, gpus in top.items())
        raise ConfigError(
            f"{specs[culprit][0]}.quota" if culprit else "virtual_clusters",
            f"the top-level quotas sum to {sum(top.values())} GPUs ({detail}) but the cluster "
            f"has {cluster.total_gpus}",
        )
    return QueueTree(
        {
            name: Queue(
                name=name,
                parent=spec.parent,
                quota=quota_of(name),
                weight=spec.weight,
                limit=spec.limit,
                is_vc=name in vc_quota,
            )
            for name, (_, spec) in specs.items()
        }
    )


def _reservations(specs: list[ReservationSpec], cluster: Cluster) -> tuple[Reservation, ...]:
    """Each reservation with its GPUs chosen, in the order given; one that cannot be made is
    refused naming it (`reservations.N.field`)."""
    made: list[Reservation] = []
    for number, spec in enumerate(specs):
        end = spec.start + spec.duration
        taken = [g for r in made if r.start < end and spec.start < r.end for g in r.gpus]
        try:
            if spec.duration <= 0:
                raise ReservationError(f"duration: must be positive, got {spec.duration:g}")
            if spec.name in {r.name for r in made}:
                raise ReservationError(f"name: {spec.name!r} is named twice")
            gpus = choose_gpus(cluster, gpus=spec.gpus, nodes=spec.nodes or (), taken=taken)
        except ReservationError as error:
            field, _, reason = str(error).partition(": ")
            raise ConfigError(f"reservations.{number}.{field}", reason) from None
        made.append(
            Reservation(
                spec.name,
                spec.start,
                spec.duration,
                gpus,
                users=frozenset(spec.users or ()),
                vcs=frozenset(spec.vcs or ()),
            )
        )
    return tuple(made)


def _maintenance(windows: list[MaintenanceSpec], cluster: Cluster) -> tuple[NodeChange, ...]:
    """The windows as drains and resumes; a node the cluster lacks, or an end not after its
    start, is refused naming the window."""
    names = {node.name for node in cluster.nodes}
    for number, window in enumerate(windows):
        if window.node not in names:
            hint = _hint(window.node, sorted(names))
            raise ConfigError(f"maintenance.{number}.node", f"no node {window.node!r}{hint}")
        if window.end is not None and window.end <= window.start:
            raise ConfigError(
                f"maintenance.{number}.end",
                f"must be after start ({window.start:g}), got {window.end:g}",
            )
    return tuple(
        maintenance_changes(
            [(w.node, w.start, w.end, w.reason, w.preempt) for w in windows],
        )
    )


def vc_gpu_quota(config: ClusterConfig) -> dict[str, int]:
    """GPUs each VC is guaranteed: its cells times the GPUs in one cell of each type (a VC with
    an empty cell map owns the whole cluster)."""
    gpus_per_type: dict[str, int] = {}
    stack = list(config.cluster.root.children)
    while stack:
        cell = stack.pop()
        if cell.is_gpu:
            continue
        gpus_per_type.setdefault(cell.cell_type, cell.total_gpus)
        stack.extend(cell.children)
    quota: dict[str, int] = {}
    for vc, cells in config.virtual_clusters.items():
        if not cells:
            quota[vc] = config.cluster.total_gpus
            continue
        for cell_type in cells:
            if cell_type not in gpus_per_type:
                raise ConfigError(
                    f"virtual_clusters.{vc}.{cell_type}",
                    f"no cell of type {cell_type!r} in the cluster",
                )
        quota[vc] = sum(count * gpus_per_type[cell_type] for cell_type, count in cells.items())
    return quota
