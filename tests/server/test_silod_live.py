"""SiloD's node caches live: jobs that name a `dataset`, real processes (local executor, one node),
each node's cache a directory the jobs fill as they read (docs/silod.md#live).

With one node, placement has no node to choose; what is observable here is what the manager does:
the variables a job gets, the allocation it records, the directories it trims or removes when
another data set takes the space, and the hits a later job of the same data set finds. Two nodes
declared on this machine (the local executor), and two Ray nodes, show cache-aware placement's
choice of node."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.cli.common import UserError
from corral.cli.up import cache_settings
from corral.core.cluster import Cluster, NodeDef
from corral.exec.cachedir import CacheDirs, trim
from corral.exec.local import LocalExecutor
from corral.server.boot import (
    BootError,
    RunningServer,
    ServerOptions,
    _build_with,
    build_manager,
)
from corral.server.datacache import CACHE_META_KEY
from corral.server.spec import SpecError, parse_job_spec
from corral.server.state import CacheSettings
from tests.server.helpers import (
    Corral,
    admin_token,
    api,
    fast_settings,
    job,
    kill_jobs_of,
    run_server,
    start_server,
    submit,
    wait_for,
    wait_until,
)

#: A job that reads every file of its data set ($STORE, the "remote storage") through its node's
#: cache: a file found there is a hit, one not found is a miss, copied in (copy on first read,
#: atomically) while the cache stays within the GB it was given. It waits for $RELEASE, if given,
#: then prints what it saw.
READER = r"""
import json, os, shutil, time
store, cache = os.environ["STORE"], os.environ.get("CORRAL_DATASET_CACHE")
budget = float(os.environ.get("CORRAL_DATASET_CACHE_GB") or 0) * 1e9
used = sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache)) if cache else 0
hits = misses = 0
for name in sorted(os.listdir(store)):
    if cache and os.path.exists(os.path.join(cache, name)):
        hits += 1
        continue
    size = os.path.getsize(os.path.join(store, name))
    if cache and used + size <= budget:
        part = os.path.join(cache, name + ".part")
        shutil.copyfile(os.path.join(store, name), part)
        os.replace(part, os.path.join(cache, name))
        used += size
    misses += 1
release = os.environ.get("RELEASE")
while release and not os.path.exists(release):
    time.sleep(0.02)
keys = ("CORRAL_DATASET", "CORRAL_DATASET_CACHE", "CORRAL_DATASET_CACHE_GB")
print(json.dumps({"hits": hits, "misses": misses} | {k: os.environ.get(k) for k in keys}))
"""

#: Each data set: 4 files of 250 kB, 0.001 GB.
FILE_BYTES = 250_000
FILES = 4
SIZE_GB = FILE_BYTES * FILES / 1e9


def storage(tmp_path: Path, name: str) -> Path:
    """A data set's "remote storage": FILES files of FILE_BYTES."""
    store = tmp_path / "storage" / name
    store.mkdir(parents=True, exist_ok=True)
    for index in range(FILES):
        (store / f"part-{index}").write_bytes(bytes([index]) * FILE_BYTES)
    return store


def reader(tmp_path: Path, name: str, data: str, **fields: Any) -> dict[str, Any]:
    env = {"STORE": str(storage(tmp_path, data))} | fields.pop("env", {})
    return {
        "name": name,
        "gpus": fields.pop("gpus", 1),
        "command": [sys.executable, "-c", READER],
        "env": env,
        "dataset": {"name": data, "size_gb": SIZE_GB} | fields.pop("dataset", {}),
        **fields,
    }


def output(data_dir: Path, job_id: str, attempt: int = 1) -> dict[str, Any]:
    text = (data_dir / "jobs" / job_id / f"attempt-{attempt}" / "rank-0.stdout").read_text()
    return dict(json.loads(text.strip().splitlines()[-1]))


def cached_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else 0


def start(data_dir: Path, gpus: int, cache_gb: float, **settings: Any) -> RunningServer:
    policy = settings.pop("policy_of_cache", "lru")
    cache = CacheSettings(gb_per_node=cache_gb, policy=policy)
    return start_server(data_dir, gpus=gpus, cache=cache, **settings)


def node_dir(server: RunningServer) -> Path:
    node = server.manager.cluster.nodes[0].name
    return server.manager.cache_path(node, "x").parent


def idle(server: RunningServer) -> bool:
    dirs = server.manager._cache_dirs
    return not isinstance(dirs, CacheDirs) or dirs.idle()


# -- the spec -------------------------------------------------------------------------------------

BASE = {"name": "t", "gpus": 1, "command": "true"}

REFUSALS = [
    ({"name": "imagenet", "size_gb": 0}, "dataset.size_gb: must be a positive number"),
    ({"name": "imagenet", "size_gb": -1}, "dataset.size_gb: must be a positive number"),
    ({"name": "imagenet", "size_gb": "140"}, "dataset.size_gb: must be a positive number"),
    ({"name": "imagenet", "size_gb": True}, "dataset.size_gb: must be a positive number"),
    ({"name": "imagenet", "size_gb": 2e6}, "dataset.size_gb: must be at most 1,000,000"),
    ({"name": "imagenet"}, "dataset.size_gb: field required"),
    ({"size_gb": 1}, "dataset.name: field required"),
    (
        {"name": "..", "size_gb": 1},
        "dataset.name: must be 1-63 characters of letters, digits, '.', '_' and '-', "
        "starting with a letter or digit",
    ),
    (
        {"name": "a/b", "size_gb": 1},
        "dataset.name: must be 1-63 characters of letters, digits, '.', '_' and '-', "
        "starting with a letter or digit",
    ),
    (
        {"name": "imagenet", "size_gb": 1, "read_gb_s": 0},
        "dataset.read_gb_s: must be a positive number",
    ),
    (
        {"name": "imagenet", "size_gb": 1, "read_gb_s": float("inf")},
        "dataset.read_gb_s: must be a positive number",
    ),
    ({"name": "imagenet", "size_gb": 1, "rate": 1}, "dataset.rate: unknown field"),
    ("imagenet", "dataset: must be a mapping: {name, size_gb, read_gb_s (optional)}"),
]


@pytest.mark.parametrize(("dataset", "message"), REFUSALS, ids=lambda value: str(value)[:30])
def test_a_bad_dataset_is_refused_in_one_line_naming_the_field(
    dataset: object, message: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_job_spec(BASE | {"dataset": dataset})
    assert str(refused.value) == message


def test_a_dataset_is_in_the_json_schema_and_defaults_its_rate() -> None:
    from corral.server.spec import DEFAULT_READ_GB_S, JobSpecModel

    schema = JobSpecModel.model_json_schema()
    dataset = schema["$defs"]["DatasetSpec"]
    assert dataset["required"] == ["name", "size_gb"]
    assert dataset["additionalProperties"] is False
    assert dataset["properties"]["size_gb"]["exclusiveMinimum"] == 0
    assert dataset["properties"]["name"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9._-]*$"
    spec = parse_job_spec(BASE | {"dataset": {"name": "imagenet", "size_gb": 140}})
    assert spec.dataset is not None and spec.dataset.read_gb_s is None
    assert DEFAULT_READ_GB_S == 0.1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((None, 2.0, None, None), "--storage-gbps: needs --cache-gb-per-node"),
        ((None, None, None, Path("/x")), "--cache-dir: needs --cache-gb-per-node"),
        ((-1.0, None, None, None), "--cache-gb-per-node: must not be negative"),
        ((10.0, 0.0, None, None), "--storage-gbps: must be positive"),
        ((10.0, None, "fifo", None), "--cache-policy: unknown 'fifo'; choose silod, lru"),
    ],
)
def test_corral_up_refuses_bad_cache_flags(arguments: tuple[Any, ...], message: str) -> None:
    with pytest.raises(UserError) as refused:
        cache_settings(*arguments)
    assert str(refused.value) == message


def test_cache_flags_become_the_managers_settings(tmp_path: Path) -> None:
    assert cache_settings(None, None, None, None) is None
    settings = cache_settings(50.0, None, "SiloD", tmp_path)
    assert settings == CacheSettings(50.0, 1.0, "silod", tmp_path.resolve())


def test_cache_aware_placement_needs_the_cache(data_dir: Path) -> None:
    options = ServerOptions(
        data_dir=data_dir, gpus=1, settings=fast_settings(placement="cache-aware"), single_user=True
    )
    with pytest.raises(BootError) as refused:
        build_manager(options)
    assert (
        str(refused.value) == "placement cache-aware: needs node data caches (--cache-gb-per-node)"
    )


# -- real jobs ----------------------------------------------------------------------------------


def test_a_job_reads_through_its_cache_and_the_next_one_hits(
    data_dir: Path, tmp_path: Path
) -> None:
    """cache-aware placement builds live; the job gets its node's directory and allocation (its
    spec cannot set them), fills it as it reads; the next job of the data set finds the files."""
    server = start(data_dir, gpus=1, cache_gb=0.01, placement="cache-aware")
    try:
        client = api(server.url, admin_token(data_dir))
        spec = reader(tmp_path, "first", "mnist", env={"CORRAL_DATASET_CACHE": "/tmp/elsewhere"})
        first = submit(client, **spec)
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        seen = output(data_dir, first)
        path = node_dir(server) / "mnist"
        assert seen == {
            "hits": 0,
            "misses": FILES,
            "CORRAL_DATASET": "mnist",
            "CORRAL_DATASET_CACHE": str(path),
            "CORRAL_DATASET_CACHE_GB": "0.001",  # lru gives it all of its data set
        }
        assert path.parent.parent == (data_dir / "cache").resolve()
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert cached_bytes(path) == FILES * FILE_BYTES
        events = [e["message"] for e in job(client, first)["events"] if e["kind"] == "cache"]
        node = server.manager.cluster.nodes[0].name
        assert events == [f"data set mnist: 0.001 of its 0.001 GB cached on {node}"]
        second = submit(client, **reader(tmp_path, "second", "mnist"))
        assert wait_for(client, second)["status"] == "SUCCEEDED"
        assert output(data_dir, second)["hits"] == FILES  # what the first left
        kept = json.loads(server.manager.store.get_meta(CACHE_META_KEY) or "{}")
        assert kept["held"][node]["mnist"][0] == pytest.approx(SIZE_GB)
        assert kept["dirs"][node] == {"mnist": pytest.approx(SIZE_GB)}
    finally:
        server.stop()


def test_lru_removes_the_directory_of_a_data_set_another_one_evicts(
    data_dir: Path, tmp_path: Path
) -> None:
    """A cache that holds one data set: the second data set's job takes it all (lru: whatever
    runs is cached), and the first's directory goes."""
    server = start(data_dir, gpus=1, cache_gb=SIZE_GB)
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **reader(tmp_path, "first", "mnist"))
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        mnist = node_dir(server) / "mnist"
        assert cached_bytes(mnist) == FILES * FILE_BYTES
        second = submit(client, **reader(tmp_path, "second", "cifar"))
        assert wait_for(client, second)["status"] == "SUCCEEDED"
        assert output(data_dir, second)["CORRAL_DATASET_CACHE_GB"] == "0.001"
        wait_until(lambda: not mnist.exists() and idle(server), "mnist's directory removed")
        assert sorted(p.name for p in node_dir(server).iterdir()) == ["cifar"]
        assert server.manager.data_cache is not None
        assert server.manager.data_cache.nodes[0].gb("mnist") == 0.0
        third = submit(client, **reader(tmp_path, "third", "mnist"))  # a miss again
        assert wait_for(client, third)["status"] == "SUCCEEDED"
        assert output(data_dir, third)["hits"] == 0
    finally:
        server.stop()


def test_silod_trims_an_evicted_data_set_once_its_reader_has_ended(
    data_dir: Path, tmp_path: Path
) -> None:
    """silod: a running job pins the part of its data set it needs (storage gives 0.0625 GB/s per
    GPU on this 2-GPU node, it reads 0.1: it needs 37.5 % cached); a job that needs its data set
    whole (it reads 1 GB/s) takes the rest. The first data set's directory keeps its files while
    its reader runs, then is trimmed to what stays allocated, least recently used files first."""
    server = start(data_dir, gpus=2, cache_gb=SIZE_GB, policy_of_cache="silod")
    release = tmp_path / "release"
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **reader(tmp_path, "first", "mnist", env={"RELEASE": str(release)}))
        mnist = node_dir(server) / "mnist"
        wait_until(lambda: cached_bytes(mnist) == FILES * FILE_BYTES, "mnist cached")
        fast = {"read_gb_s": 1.0}
        second = submit(client, **reader(tmp_path, "second", "cifar", dataset=fast))
        assert wait_for(client, second)["status"] == "SUCCEEDED"
        seen = output(data_dir, second)
        assert seen["CORRAL_DATASET_CACHE_GB"] == "0.000625"  # what the first does not pin
        cache = server.manager.data_cache
        assert cache is not None and cache.nodes[0].gb("mnist") == pytest.approx(0.375 * SIZE_GB)
        assert cached_bytes(mnist) == FILES * FILE_BYTES  # its reader still runs
        release.touch()
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        wait_until(
            lambda: cached_bytes(mnist) <= 0.375 * SIZE_GB * 1e9 and idle(server),
            "mnist trimmed to its allocation",
        )
        assert cached_bytes(mnist) == FILE_BYTES  # 3 of the 4 files went
        third = submit(client, **reader(tmp_path, "third", "mnist"))
        assert wait_for(client, third)["status"] == "SUCCEEDED"
        assert output(data_dir, third)["hits"] == 1
    finally:
        release.touch()
        server.stop()


def test_a_running_job_keeps_its_data_set_and_a_job_without_room_reads_storage(
    data_dir: Path, tmp_path: Path
) -> None:
    """lru pins what a running job's data set holds: a second data set finds no room, its job gets
    no cache variables (it reads storage), and the first directory stays."""
    server = start(data_dir, gpus=2, cache_gb=SIZE_GB)
    release = tmp_path / "release"
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **reader(tmp_path, "first", "mnist", env={"RELEASE": str(release)}))
        mnist = node_dir(server) / "mnist"
        wait_until(lambda: cached_bytes(mnist) == FILES * FILE_BYTES, "mnist cached")
        second = submit(client, **reader(tmp_path, "second", "cifar"))
        assert wait_for(client, second)["status"] == "SUCCEEDED"
        seen = output(data_dir, second)
        assert seen["CORRAL_DATASET_CACHE"] is None and seen["misses"] == FILES
        node = server.manager.cluster.nodes[0].name
        events = [e["message"] for e in job(client, second)["events"] if e["kind"] == "cache"]
        assert events == [f"data set cifar: no cache space on {node}; it reads storage"]
        assert not (node_dir(server) / "cifar").exists()
        release.touch()
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        assert cached_bytes(mnist) == FILES * FILE_BYTES
    finally:
        release.touch()
        server.stop()


def test_a_restart_keeps_what_the_caches_hold_and_clears_what_it_does_not_know(
    data_dir: Path, tmp_path: Path
) -> None:
    """The model is kept in the store: after a restart the data set is still held (a hit), and a
    directory the record does not know (a crash's leftover) is removed."""
    server = start(data_dir, gpus=1, cache_gb=0.01)
    try:
        client = api(server.url, admin_token(data_dir))
        first = submit(client, **reader(tmp_path, "first", "mnist"))
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        nodes = node_dir(server)
    finally:
        server.stop()
    stray = nodes / "leftover"
    stray.mkdir()
    (stray / "data").write_bytes(b"x" * 1000)
    link = nodes / "mnist" / "escape"
    os.symlink(tmp_path / "storage", link)  # a job's link: removing must not follow it
    server = start(data_dir, gpus=1, cache_gb=0.01)
    try:
        cache = server.manager.data_cache
        assert cache is not None and cache.nodes[0].gb("mnist") == pytest.approx(SIZE_GB)
        wait_until(lambda: not stray.exists() and idle(server), "the leftover removed")
        client = api(server.url, admin_token(data_dir))
        again = submit(client, **reader(tmp_path, "again", "mnist"))
        assert wait_for(client, again)["status"] == "SUCCEEDED"
        assert output(data_dir, again)["hits"] == FILES
    finally:
        server.stop()
    assert len(list((tmp_path / "storage" / "mnist").iterdir())) == FILES


def test_trimming_never_follows_a_link(tmp_path: Path) -> None:
    """A job's directory with links to elsewhere: trimming and removing unlink the links only."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p" * 100)
    target = tmp_path / "cache" / "node" / "data"
    (target / "sub").mkdir(parents=True)
    for index in range(3):
        (target / "sub" / f"f{index}").write_bytes(b"d" * 100)
        os.utime(target / "sub" / f"f{index}", (1000 + index, 1000 + index))
    os.symlink(outside, target / "dirlink")
    os.symlink(outside / "precious", target / "filelink")
    assert trim(target, 250) == 100  # the oldest file went
    assert sorted(p.name for p in (target / "sub").iterdir()) == ["f1", "f2"]
    assert trim(target, 0) == 0
    assert not target.exists() and not any((tmp_path / "cache" / "node").iterdir())
    assert (outside / "precious").read_bytes() == b"p" * 100


# -- two nodes declared on this machine: cache-aware placement, local executor ----------------


def attempt_ended(client: Any, job_id: str) -> None:
    """Wait until the job's last attempt has ended (its processes gone, its GPUs free)."""
    wait_until(
        lambda: job(client, job_id)["attempt_history"][-1]["state"] == "ended",
        f"job {job_id}'s attempt ended",
    )


def two_cached_nodes(data_dir: Path) -> RunningServer:
    """Nodes n0 and n1 of two GPUs each, declared on this machine (the local executor runs both
    nodes' jobs here), each with its own cache directory (DATA_DIR/cache/n0, .../n1) of 0.01 GB;
    silod's cache policy; placement cache-aware."""
    data_dir.mkdir(parents=True)
    cache = CacheSettings(gb_per_node=0.01, policy="silod")
    settings = fast_settings(policy="fifo", placement="cache-aware", cache=cache)
    options = ServerOptions(data_dir=data_dir, settings=settings, single_user=True)
    cluster = Cluster.from_nodes([NodeDef("n0", 2, "gpu"), NodeDef("n1", 2, "gpu")])
    return run_server(_build_with(options, LocalExecutor(), cluster, None))


def test_cache_aware_sends_a_job_to_the_declared_node_that_caches_its_data(
    data_dir: Path, tmp_path: Path
) -> None:
    """On two declared nodes, a job goes to the node whose cache holds its data set, not to the
    node consolidate's best fit picks; a data set cached nowhere follows best fit."""
    # Storage gives 1 Gbit/s = 0.125 GB/s per node, 0.0625 per GPU; the readers read 1 GB/s
    # per GPU: IO-bound, so the cache decides. Consolidate puts a 1-GPU job on the node with
    # the fewest free GPUs that holds it (ties: n0). By hand:
    # 1. S1, S2 (no data set): S1 on n0 (a tie), S2 on n0 (1 free there, 2 on n1). n0 is full.
    # 2. first (mnist) runs on n1, the only room, and fills n1's cache with mnist.
    # 3. S2 is cancelled: n0 has 1 free GPU, n1 2.
    # 4. other (cifar, cached nowhere): placed as consolidate would, on n0 (the tightest); it
    #    ends and frees it.
    # 5. again (mnist): consolidate would pick n0 (the tightest); cache-aware picks n1, which
    #    caches mnist, and the job hits there. (Cache-aware placing as consolidate: n0, misses.)
    server = two_cached_nodes(data_dir)
    fast = {"read_gb_s": 1.0}
    try:
        client = api(server.url, admin_token(data_dir))
        sleep = {"gpus": 1, "command": "exec sleep 3600", "grace_seconds": 1}
        s1, s2 = (submit(client, name=name, **sleep) for name in ("S1", "S2"))
        for job_id in (s1, s2):
            assert wait_for(client, job_id, ["RUNNING"])["placement"][0].startswith("n0/")
        first = submit(client, **reader(tmp_path, "first", "mnist", dataset=fast))
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        assert job(client, first)["attempt_history"][0]["gpus"][0].startswith("n1/")
        assert output(data_dir, first)["misses"] == FILES
        n1_mnist = server.manager.cache_path("n1", "mnist")
        assert cached_bytes(n1_mnist) == FILES * FILE_BYTES

        client.post(f"/api/v1/jobs/{s2}/cancel")
        assert wait_for(client, s2)["status"] == "CANCELLED"
        attempt_ended(client, s2)
        other = submit(client, **reader(tmp_path, "other", "cifar", dataset=fast))
        assert wait_for(client, other)["status"] == "SUCCEEDED"
        assert job(client, other)["attempt_history"][0]["gpus"][0].startswith("n0/")
        attempt_ended(client, other)

        again = submit(client, **reader(tmp_path, "again", "mnist", dataset=fast))
        assert wait_for(client, again)["status"] == "SUCCEEDED"
        assert job(client, again)["attempt_history"][0]["gpus"][0].startswith("n1/")
        seen = output(data_dir, again)
        assert seen["hits"] == FILES
        assert seen["CORRAL_DATASET_CACHE"] == str(n1_mnist)
        client.post(f"/api/v1/jobs/{s1}/cancel")
        assert wait_for(client, s1)["status"] == "CANCELLED"
    finally:
        server.stop()


# -- two nodes: cache-aware placement on a Ray cluster ------------------------------------------


@pytest.fixture
def ray_cluster() -> Iterator[Any]:
    from tests.exec.ray_cluster import RayCluster

    cluster = RayCluster(gpus_per_node=1, node_names=("n0", "n1"), head="head")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_cache_aware_placement_sends_a_job_to_the_node_that_caches_its_data(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Two 1-GPU Ray nodes, each with its own cache directory. mnist is cached on n1 (n0 was
    busy); with both free, cache-aware picks n1, and the job hits there. Its job reads 1 GB/s per
    GPU: IO-bound on 0.125. Consolidate, between two nodes equally free, takes the one that
    became free first (`Cluster.nodes_with_free`: the order of its free-GPU buckets is their
    history); the blocker on n0 therefore ends before mnist's reader on n1, so that consolidate
    would pick n0 and only the cache sends the job to n1."""
    from corral.exec.ray import RayExecutor
    from corral.server.executors.ray import ray_namespace

    data_dir = tmp_path / "state"
    data_dir.mkdir()
    cache = CacheSettings(gb_per_node=0.01, policy="silod")
    settings = fast_settings(placement="cache-aware", cache=cache)
    options = ServerOptions(
        data_dir=data_dir,
        executor="ray",
        executor_options={"address": ray_cluster.address},
        settings=settings,
        single_user=True,
    )
    executor = RayExecutor(ray_cluster.address, ray_namespace(data_dir))
    try:
        manager = build_manager(options, executor)
    except BaseException:
        executor.close()
        raise
    server = run_server(manager)
    release = tmp_path / "release"
    read_done = tmp_path / "read-done"
    fast = {"read_gb_s": 1.0}
    try:
        client = api(server.url, admin_token(data_dir))
        blocker = submit(
            client,
            name="blocker",
            gpus=1,
            command=[sys.executable, "-c", READER],
            env={"STORE": str(storage(tmp_path, "none")), "RELEASE": str(release)},
        )
        wait_for(client, blocker, ("RUNNING",))
        assert job(client, blocker)["attempt_history"][0]["gpus"] == ["n0/0"]
        first = submit(
            client,
            **reader(tmp_path, "first", "mnist", dataset=fast, env={"RELEASE": str(read_done)}),
        )
        wait_for(client, first, ("RUNNING",))
        assert job(client, first)["attempt_history"][0]["gpus"] == ["n1/0"]
        cached = (data_dir / "cache" / "n1" / "mnist").resolve()
        wait_until(lambda: cached_bytes(cached) == FILES * FILE_BYTES, "mnist cached on n1")
        release.touch()  # n0 becomes free first,
        assert wait_for(client, blocker)["status"] == "SUCCEEDED"
        attempt_ended(client, blocker)
        read_done.touch()  # then n1
        assert wait_for(client, first)["status"] == "SUCCEEDED"
        attempt_ended(client, first)
        again = submit(client, **reader(tmp_path, "again", "mnist", dataset=fast))
        assert wait_for(client, again)["status"] == "SUCCEEDED"
        assert job(client, again)["attempt_history"][0]["gpus"] == ["n1/0"]
        seen = output(data_dir, again)
        assert seen["hits"] == FILES
        assert seen["CORRAL_DATASET_CACHE"] == str(cached)
        # What eviction runs on a Ray node: a trim as a task there.
        dirs = executor.cache_dirs()
        dirs.trim("n1", cached, FILE_BYTES)
        wait_until(lambda: not dirs.busy("n1", cached), "the trim on n1")
        assert cached_bytes(cached) == FILE_BYTES
    finally:
        release.touch()
        read_done.touch()
        server.stop()


# -- multi-user mode: a data set is cached per account ------------------------------------------


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd: multi-user mode runs jobs under accounts the test creates",
)
def test_each_account_has_its_own_cache_that_no_other_account_can_touch() -> None:
    """Root's manager runs alice's and bob's jobs under their accounts: the same data set name is
    two directories, each its account's (0700) below the manager's (0711, not listable); bob's job
    can neither list the node's caches nor read or delete alice's."""
    suffix = uuid.uuid4().hex[:6]
    accounts = {"alice": f"crl-alice-{suffix}", "bob": f"crl-bob-{suffix}"}
    created: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="corral-cache-"))  # reachable by the accounts
    corral: Corral | None = None
    try:
        base.chmod(0o711)
        for account in accounts.values():
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    account,
                ],
                check=True,
                capture_output=True,
            )
            created.append(account)
        corral = Corral(
            base / "state", "--gpus", "1", "--multi-user", "--cache-gb-per-node", "0.01"
        )
        admin = corral.start()

        def client(user: str) -> Any:
            body = {"user": user, "vc": "default", "unix_user": accounts[user]}
            response = admin.post("/api/v1/tokens", json=body)
            assert response.status_code == 201, response.text
            return api(corral.url, response.json()["token"])

        dataset = {"name": "mnist", "size_gb": 0.001}
        alice = client("alice")
        alices = submit(
            alice,
            name="fill",
            gpus=1,
            dataset=dataset,
            command='echo alice-data > "$CORRAL_DATASET_CACHE/part-0" && echo "$CORRAL_DATASET_CACHE"',
        )
        assert wait_for(alice, alices)["status"] == "SUCCEEDED"
        theirs = Path(alice.get(f"/api/v1/jobs/{alices}/logs").text.strip())
        assert theirs.name == f"mnist@{accounts['alice']}"
        bob = client("bob")
        probes = (
            'echo "mine $CORRAL_DATASET_CACHE"; echo bob-data > "$CORRAL_DATASET_CACHE/part-0"; '
            f'ls "{theirs.parent}" >/dev/null 2>&1 && echo "list: ALLOWED" || echo "list: denied"; '
            f'cat "{theirs}/part-0" >/dev/null 2>&1 && echo "read: ALLOWED" || echo "read: denied"; '
            f'rm -rf "{theirs}" 2>/dev/null || echo "delete: denied"'
        )
        bobs = submit(bob, name="probe", gpus=1, dataset=dataset, command=probes)
        assert wait_for(bob, bobs)["status"] == "SUCCEEDED"
        log = bob.get(f"/api/v1/jobs/{bobs}/logs").text
        mine = theirs.with_name(f"mnist@{accounts['bob']}")
        assert f"mine {mine}" in log
        for probe in ("list", "read", "delete"):
            assert f"{probe}: denied" in log, log
        assert (theirs / "part-0").read_text() == "alice-data\n"
        for path, account in ((theirs, "alice"), (mine, "bob")):
            info = path.stat()
            assert info.st_uid == pwd.getpwnam(accounts[account]).pw_uid
            assert stat.S_IMODE(info.st_mode) == 0o700
        for manager_dir in (theirs.parent, theirs.parent.parent):
            info = manager_dir.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o711)
    finally:
        if corral is not None:
            corral.stop()
            kill_jobs_of(corral.data_dir)
        for account in created:
            subprocess.run(["pkill", "-KILL", "-u", account], capture_output=True)
            subprocess.run(["userdel", account], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
