"""The openb reader on small files written here, and FGD's replay through the ordinary simulator
(place or fail on arrival, the fragmentation probe) on a hand-worked cluster."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from corral.cli.main import app
from corral.core.cluster import Cluster, NodeDef
from corral.core.fragmentation import TaskShape, Workload
from corral.core.job import JobSpec, JobStatus
from corral.core.placement import make_placement
from corral.core.placement.sharing import Fgd
from corral.core.policy import make_policy
from corral.core.scheduler import Scheduler
from corral.sim.engine import Simulation
from corral.sim.fragmentation import FragmentationProbe, make_grid
from corral.sim.traces import load_trace
from corral.sim.traces.base import TraceError
from corral.sim.traces.openb import arrival_sequence, read_nodes, read_tasks

NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
TASKS_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text(header + "".join(row + "\n" for row in rows))
    return path


def error_of(read, path: Path) -> str:
    with pytest.raises(TraceError) as error:
        read(path)
    message = str(error.value)
    assert "\n" not in message
    return message


# -- nodes ---------------------------------------------------------------------------------------


def test_reads_nodes_and_lowercases_models(tmp_path: Path):
    path = write(
        tmp_path / "nodes.csv",
        NODES_HEADER,
        ["n0,64000,262144,2,P100", "n1,96000,786432,8,V100M32", "", "n2,8000,32768,0,"],
    )
    # The cluster holds GPU nodes: the node without GPUs is skipped (and counted).
    assert read_nodes(path) == (
        [
            NodeDef("n0", 2, "p100", cpu_milli=64000, memory_mib=262144),
            NodeDef("n1", 8, "v100m32", cpu_milli=96000, memory_mib=786432),
        ],
        1,
    )


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (["n0,64000,262144,2,P100", "n1,lots,262144,2,P100"], "line 3: cpu_milli"),
        (["n0,64000,-5,2,P100"], "line 2: memory_mib"),
        (["n0,64000,262144,2.5,P100"], "line 2: gpu"),
        (["n0,64000,262144,2,"], "line 2: model: missing"),
        (["n0,64000,262144,2,P100", "n0,64000,262144,2,P100"], "line 3: sn: duplicate"),
        (["n0,64000,262144,2"], "line 2: expected 5 columns"),
        ([], "no nodes"),
    ],
)
def test_malformed_node_rows_name_file_line_and_field(tmp_path: Path, rows, needle):
    message = error_of(read_nodes, write(tmp_path / "nodes.csv", NODES_HEADER, rows))
    assert "nodes.csv" in message and needle in message


def test_node_file_errors(tmp_path: Path):
    assert "no such file" in error_of(read_nodes, tmp_path / "missing.csv")
    bad_header = write(tmp_path / "h.csv", "sn,cpu_milli,gpu,model\n", ["n0,1,1,P100"])
    assert "header: missing column(s) memory_mib" in error_of(read_nodes, bad_header)


# -- tasks ---------------------------------------------------------------------------------------


def test_reads_tasks_as_jobs_with_shares_whole_gpus_cpu_only_and_gpu_specs(tmp_path: Path):
    path = write(
        tmp_path / "pods.csv",
        TASKS_HEADER,
        [
            "p0,12000,16384,1,1000,,LS,Running,0,100,0",
            "p1,6000,12288,1,460,V100M16|V100M32,LS,Running,5,100,5",
            "p2,4000,8192,0,0,,BE,Failed,6,7,6",
            "p3,64000,262144,8,1000,,LS,Pending,9,,",
        ],
    )
    jobs = read_tasks(path)
    assert [j.id for j in jobs] == ["p0", "p1", "p2", "p3"]
    assert TaskShape.of(jobs[0]) == TaskShape(12000, 16384, 1, 1000)
    assert TaskShape.of(jobs[1]) == TaskShape(
        6000, 12288, 1, 460, frozenset({"v100m16", "v100m32"})
    )
    assert jobs[1].shares_gpu and not jobs[1].plain
    assert TaskShape.of(jobs[2]) == TaskShape(4000, 8192, 0, 0) and jobs[2].gpus == 0
    assert jobs[3].total_gpu_milli == 8000
    assert all(j.duration_s is None for j in jobs)  # they never end


def test_reads_the_five_column_variant(tmp_path: Path):
    # openb_pod_list_multigpu50.csv stops after gpu_milli.
    path = write(
        tmp_path / "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", ["a,1,2,4,1000"]
    )
    assert read_tasks(path) == [JobSpec("a", 0.0, 4, cpu_milli=1, memory_mib=2, gpu_milli=1000)]


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p1,6000,12288,1,1500,,LS,Running,0,1,0", "line 3: gpu_milli: must be 1..1000"),
        ("p1,6000,12288,1,0,,LS,Running,0,1,0", "line 3: gpu_milli: must be 1..1000"),
        ("p1,6000,12288,2,500,,LS,Running,0,1,0", "line 3: gpu_milli: a task of 2 GPUs"),
        ("p1,6000,12288,0,300,,LS,Running,0,1,0", "line 3: gpu_milli: must be 0"),
        ("p1,6000,12288,one,1000,,LS,Running,0,1,0", "line 3: num_gpu"),
        ("p1,,12288,1,1000,,LS,Running,0,1,0", "line 3: cpu_milli"),
        ("p0,6000,12288,1,1000,,LS,Running,0,1,0", "line 3: name: duplicate task 'p0'"),
        (",6000,12288,1,1000,,LS,Running,0,1,0", "line 3: name: missing"),
        ("p1,0,0,0,0,,LS,Running,0,1,0", "line 3: a task without GPUs must ask for CPU"),
    ],
)
def test_malformed_task_rows_name_file_line_and_field(tmp_path: Path, row: str, needle: str):
    path = write(
        tmp_path / "pods.csv", TASKS_HEADER, ["p0,1000,1024,1,1000,,LS,Running,0,1,0", row]
    )
    message = error_of(read_tasks, path)
    assert "pods.csv" in message and needle in message


def test_task_file_without_rows_is_refused(tmp_path: Path):
    assert "no tasks" in error_of(read_tasks, write(tmp_path / "e.csv", TASKS_HEADER, []))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty file" in error_of(read_tasks, empty)


# -- the trace: arrivals -------------------------------------------------------------------------


def job(name: str, gpus: int, milli: int = 1000) -> JobSpec:
    return JobSpec(name, 0.0, gpus, gpu_milli=milli, cpu_milli=1000, memory_mib=1024)


def test_arrival_sequence_tops_the_trace_up_to_the_target():
    gpu, cpu = job("a", 1), job("b", 0)
    # Capacity 4,000 milli at target 1.0: the trace asks 1,000; whole-GPU copies are drawn until
    # one more would pass 4,000, so exactly 4 GPU tasks arrive, plus however many CPU-only ones.
    sequence = arrival_sequence([gpu, cpu], 4000, 1.0, random.Random(5))
    assert sum(t.total_gpu_milli for t in sequence) == 4000
    assert {"a", "b"} <= {t.id for t in sequence}
    assert len({t.id for t in sequence}) == len(sequence)
    assert [t.id for t in sequence] == [
        t.id for t in arrival_sequence([gpu, cpu], 4000, 1.0, random.Random(5))
    ]
    # A trace that already asks more than the target is cut down (random tasks dropped).
    assert arrival_sequence([gpu, cpu], 4000, 0.1, random.Random(5)) == [cpu]


def test_the_trace_brings_its_nodes_workload_and_arrivals(tmp_path: Path):
    nodes = write(tmp_path / "n.csv", NODES_HEADER, ["n0,8000,16384,2,T4"])
    pods = write(
        tmp_path / "p.csv",
        TASKS_HEADER,
        ["p0,1000,1024,1,500,,LS,Running,0,1,0", "p1,1000,1024,0,0,,LS,Running,0,1,0"],
    )
    trace = load_trace(f"openb:{nodes},{pods},load=1.0", seed=3)
    assert trace.nodes == [NodeDef("n0", 2, "t4", cpu_milli=8000, memory_mib=16384)]
    assert trace.place_or_fail and trace.target_load == 1.0
    assert trace.workload is not None and trace.workload.total_weight == 2  # the pods' types
    # 2,000 milli of capacity: the 500-milli share four times, and CPU-only copies, one a second.
    assert sum(spec.total_gpu_milli for spec in trace.jobs) == 2000
    assert [spec.submit_time for spec in trace.jobs] == [float(i) for i in range(len(trace.jobs))]
    again = load_trace(f"openb:{nodes},{pods},load=1.0", seed=3)
    assert [s.id for s in again.jobs] == [s.id for s in trace.jobs]
    for location, needle in (
        (f"openb:{pods}", "expected openb:NODES_CSV,PODS_CSV"),
        (f"openb:{nodes},{pods},load=0", "load: must be in (0, 10]"),
        (f"openb:{nodes},{pods},tune=1", "unknown option 'tune'"),
    ):
        with pytest.raises(TraceError, match=needle.replace("(", r"\(").replace("]", r"\]")):
            load_trace(location)


# -- the replay: the simulator, placing or failing on arrival ------------------------------------

ONE_NODE = [NodeDef("n", 2, "v100", cpu_milli=4000, memory_mib=8192)]
SHARE = job("t1", 1, 500)
ONE_GPU = job("t2", 1)
TWO_GPUS = job("t3", 2)


def replay(
    specs: list[JobSpec], placement: str, workload: Workload, grid: list[float]
) -> FragmentationProbe:
    cluster = Cluster.from_nodes(ONE_NODE)
    placer = Fgd(workload) if placement == "fgd" else make_placement(placement)
    scheduler = Scheduler(cluster, make_policy("fifo"), placer)
    probe = FragmentationProbe(cluster, workload, grid)
    arrivals = [replace(spec, submit_time=float(i)) for i, spec in enumerate(specs)]
    Simulation(arrivals, scheduler, place_or_fail=True, observer=probe).run()
    probe.finish()
    return probe


def _at(spec: JobSpec, when: float) -> JobSpec:
    return replace(spec, submit_time=when)


def test_replay_records_allocation_fragmentation_and_failures_by_hand():
    # Capacity 2,000 milli; grid every 25% up to 150%: marks at 0, 500, ..., 3000 milli.
    # Arrived after each task: 500, 1500, 3500. A point x holds the state once every task that
    # arrived while at most x x capacity was requested has been placed (or has failed).
    workload = Workload([(TaskShape.of(t), 1) for t in (SHARE, ONE_GPU, TWO_GPUS)])
    grid = make_grid(1.5, 0.25)
    assert grid == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    run = replay([SHARE, ONE_GPU, TWO_GPUS], "fgd", workload, grid)
    curves = run.curves
    # x=0: empty; x=0.25, 0.5: the share (500) placed; x>=0.75: the whole GPU too (1,500).
    # The two-GPU task arrives at 175%, past the grid, and fails (only 500 milli left).
    assert curves["allocated_share"] == [0, 0.25, 0.25, 0.75, 0.75, 0.75, 0.75]
    assert run.failed == 1 and run.first_failure == pytest.approx(1.75)
    assert curves["failed_task_share"] == [0.0] * 7
    # Fragmentation, each type weighted 1/3:
    # - empty (1000, 1000), 4 CPUs: every type fits with nothing left over: 0.
    # - after the share (500, 1000), 3 CPUs: share 0; one GPU: the 500 GPU is too small: 500;
    #   two GPUs cannot run: all 1,500. F = 2000/3 milli = 1/3 of capacity; 2000/3 / 1500 free.
    # - after the whole GPU (0, 500), 2 CPUs: share fits, 0; one GPU and two GPUs cannot run:
    #   500 each. F = 1000/3 = 1/6 of capacity, and 2/3 of the 500 milli free.
    third, sixth = 1 / 3, 1 / 6
    assert curves["frag_share"] == pytest.approx([0, third, third, sixth, sixth, sixth, sixth])
    assert curves["frag_rate"][1] == pytest.approx((2000 / 3) / 1500)
    assert curves["frag_rate"][-1] == pytest.approx(2 / 3)
    assert curves["unallocated_share"][-1] == pytest.approx(0.25)
    summary = run.summary()
    assert summary["unplaced_jobs"] == 1 and summary["arrived_jobs"] == 3
    assert summary["unallocated_share_at_100"] == pytest.approx(0.25)


def test_failed_shares_count_tasks_and_their_gpus():
    # Two two-GPU tasks on one 2-GPU node: the second fails at 200% arrived.
    second = JobSpec("t4", 0.0, 2, cpu_milli=1000, memory_mib=1024)
    run = replay([TWO_GPUS, second], "best-fit", Workload([(TaskShape.of(TWO_GPUS), 1)]), [2.0])
    assert run.curves["failed_task_share"] == [0.5]
    assert run.curves["failed_gpu_share"] == [0.5]
    assert run.curves["frag_share"] == [0.0]  # nothing left, nothing fragmented


def test_a_job_not_placed_on_arrival_is_given_up():
    cluster = Cluster.from_nodes(ONE_NODE)
    scheduler = Scheduler(cluster, make_policy("fifo"), make_placement("best-fit"))
    jobs = [_at(TWO_GPUS, 0.0), _at(JobSpec("t4", 0.0, 1, cpu_milli=1000), 1.0)]
    simulation = Simulation(jobs, scheduler, place_or_fail=True)
    simulation.run()
    assert scheduler.jobs["t3"].status is JobStatus.RUNNING  # and never ends
    given_up = scheduler.jobs["t4"]
    assert given_up.status is JobStatus.CANCELLED and simulation.unplaced == 1
    assert given_up.last_event == "given up: not placed when it arrived"


# -- corral simulate on an openb trace -----------------------------------------------------------


def test_simulate_runs_an_openb_trace_and_reports_fragmentation(tmp_path: Path):
    nodes = write(tmp_path / "n.csv", NODES_HEADER, ["n0,8000,16384,2,T4", "n1,16000,32768,4,G2"])
    pods = write(
        tmp_path / "p.csv",
        TASKS_HEADER,
        [
            "p0,1000,1024,1,500,,LS,Running,0,1,0",
            "p1,2000,1024,0,0,,LS,Running,0,1,0",
            "p2,4000,4096,2,1000,,LS,Running,0,1,0",
        ],
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "simulate", "--trace", f"openb:{nodes},{pods}", "--policy", "fifo",
            "--placement", "fgd", "--seed", "2", "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 nodes (1x2 t4, 1x4 g2), 6 GPUs" in result.output
    assert "fifo/fgd: at 100% arrived" in result.output
    [run] = json.loads((out / "summary.json").read_text())["runs"]
    assert run["placement"] == "fgd" and run["arrived_jobs"] >= 3
    for key in ("frag_share_at_100", "unallocated_share_at_end", "failed_task_share_at_end"):
        assert 0.0 <= run[key] <= 1.0
    curves = (out / "curves-fifo-fgd.csv").read_text().splitlines()
    assert curves[0].startswith("arrived_share,allocated_share,unallocated_share,frag_share")
    assert len(curves) == 1 + 131  # 0% .. 130% by 1%
    # A placement that gives whole GPUs only refuses the shares, in one line.
    refused = CliRunner().invoke(
        app,
        ["simulate", "--trace", f"openb:{nodes},{pods}", "--policy", "fifo", "--out", str(out)],
    )
    assert refused.exit_code == 2 and "placement relax gives whole GPUs only" in refused.output


def test_openbs_nodes_are_the_experiment_and_refuse_a_cluster_config(tmp_path):
    from corral.sim.runner import RunSettings, SimulationError, build_cluster
    from corral.sim.traces import Trace

    trace = Trace(jobs=[], source="openb:pods.csv", nodes=[NodeDef("n", 2)])
    settings = RunSettings(trace="openb:pods.csv", config=tmp_path / "cluster.yaml")
    with pytest.raises(SimulationError, match="brings its own nodes; leave out --config"):
        build_cluster(settings, trace)
