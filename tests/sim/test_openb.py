"""The openb reader on small files written here, and the FGD replay on a hand-worked cluster."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from corral.core.sharing import GpuNode, SharingTask, TaskShape, Workload
from corral.sim.sharing import (
    ExperimentSettings,
    arrival_sequence,
    make_grid,
    replay,
    run_experiment,
    summarize,
)
from corral.sim.traces.base import TraceError
from corral.sim.traces.openb import read_nodes, read_tasks

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
    assert read_nodes(path) == [
        GpuNode("n0", 64000, 262144, 2, "p100"),
        GpuNode("n1", 96000, 786432, 8, "v100m32"),
        GpuNode("n2", 8000, 32768, 0, ""),
    ]


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


def test_reads_tasks_with_shares_whole_gpus_cpu_only_and_gpu_specs(tmp_path: Path):
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
    tasks = read_tasks(path)
    assert [t.name for t in tasks] == ["p0", "p1", "p2", "p3"]
    assert tasks[0].shape == TaskShape(12000, 16384, 1, 1000)
    assert tasks[1].shape == TaskShape(6000, 12288, 1, 460, frozenset({"v100m16", "v100m32"}))
    assert tasks[1].shape.shares_gpu
    assert tasks[2].shape == TaskShape(4000, 8192, 0, 0)
    assert tasks[3].shape.total_gpu_milli == 8000


def test_reads_the_five_column_variant(tmp_path: Path):
    # openb_pod_list_multigpu50.csv stops after gpu_milli.
    path = write(
        tmp_path / "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", ["a,1,2,4,1000"]
    )
    assert read_tasks(path) == [SharingTask("a", TaskShape(1, 2, 4, 1000))]


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


# -- the replay ----------------------------------------------------------------------------------

ONE_NODE = [GpuNode("n", cpu_milli=4000, memory_mib=8192, num_gpu=2, gpu_model="v100")]
SHARE = SharingTask("t1", TaskShape(1000, 1024, 1, 500))
ONE_GPU = SharingTask("t2", TaskShape(1000, 1024, 1, 1000))
TWO_GPUS = SharingTask("t3", TaskShape(1000, 1024, 2, 1000))


def test_replay_records_allocation_fragmentation_and_failures_by_hand():
    # Capacity 2,000 milli; grid every 25% up to 150%: marks at 0, 500, ..., 3000 milli.
    # Arrived after each task: 500, 1500, 3500. A point x holds the state once every task that
    # arrived while at most x x capacity was requested has been placed (or has failed).
    workload = Workload([(t.shape, 1) for t in (SHARE, ONE_GPU, TWO_GPUS)])
    grid = make_grid(1.5, 0.25)
    assert grid == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    run = replay(ONE_NODE, [SHARE, ONE_GPU, TWO_GPUS], "fgd", workload, grid)
    # x=0: empty; x=0.25, 0.5: the share (500) placed; x>=0.75: the whole GPU too (1,500).
    # The two-GPU task arrives at 175%, past the grid, and fails (only 500 milli left).
    assert run.curves["allocated_share"] == [0, 0.25, 0.25, 0.75, 0.75, 0.75, 0.75]
    assert run.failed == 1 and run.first_failure_share == pytest.approx(1.75)
    assert run.curves["failed_task_share"] == [0.0] * 7
    # Fragmentation, each type weighted 1/3:
    # - empty (1000, 1000), 4 CPUs: every type fits with nothing left over: 0.
    # - after the share (500, 1000), 3 CPUs: share 0; one GPU: the 500 GPU is too small: 500;
    #   two GPUs cannot run: all 1,500. F = 2000/3 milli = 1/3 of capacity; 2000/3 / 1500 free.
    # - after the whole GPU (0, 500), 2 CPUs: share fits, 0; one GPU and two GPUs cannot run:
    #   500 each. F = 1000/3 = 1/6 of capacity, and 2/3 of the 500 milli free.
    third, sixth = 1 / 3, 1 / 6
    assert run.curves["frag_share"] == pytest.approx([0, third, third, sixth, sixth, sixth, sixth])
    assert run.curves["frag_rate"][1] == pytest.approx((2000 / 3) / 1500)
    assert run.curves["frag_rate"][-1] == pytest.approx(2 / 3)
    assert run.curves["unallocated_share"][-1] == pytest.approx(0.25)


def test_failed_shares_count_tasks_and_their_gpus():
    # Two two-GPU tasks on one 2-GPU node: the second fails at 200% arrived.
    second = SharingTask("t4", TWO_GPUS.shape)
    run = replay(ONE_NODE, [TWO_GPUS, second], "best-fit", Workload([(TWO_GPUS.shape, 1)]), [2.0])
    assert run.curves["failed_task_share"] == [0.5]
    assert run.curves["failed_gpu_share"] == [0.5]
    assert run.curves["frag_share"] == [0.0]  # nothing left, nothing fragmented


def test_arrival_sequence_tops_the_trace_up_to_the_target():
    gpu = SharingTask("a", TaskShape(1000, 1024, 1, 1000))
    cpu = SharingTask("b", TaskShape(1000, 1024, 0, 0))
    # Capacity 4,000 milli at target 1.0: the trace asks 1,000; whole-GPU copies are drawn until
    # one more would pass 4,000, so exactly 4 GPU tasks arrive, plus however many CPU-only ones.
    sequence = arrival_sequence([gpu, cpu], 4000, 1.0, random.Random(5))
    assert sum(t.shape.total_gpu_milli for t in sequence) == 4000
    assert {"a", "b"} <= {t.name for t in sequence}
    assert len({t.name for t in sequence}) == len(sequence)
    assert [t.name for t in sequence] == [
        t.name for t in arrival_sequence([gpu, cpu], 4000, 1.0, random.Random(5))
    ]
    # A trace that already asks more than the target is cut down (random tasks dropped).
    assert arrival_sequence([gpu, cpu], 4000, 0.1, random.Random(5)) == [cpu]


def test_experiment_medians_and_summary(tmp_path: Path):
    tasks = [SHARE, ONE_GPU, TWO_GPUS]
    settings = ExperimentSettings(policies=("fgd", "random-fit"), target_load=1.0, repeats=3)
    experiment = run_experiment(ONE_NODE, tasks, settings)
    assert [r.policy for r in experiment.results] == ["fgd", "random-fit"]
    assert all(len(r.runs) == 3 for r in experiment.results)
    summary = summarize(experiment)
    assert summary["gpus"] == 2.0 and summary["nodes"] == 1
    for run in summary["runs"]:
        assert 0.0 <= run["unallocated_share_at_100"] <= 1.0
        assert run["frag_share_at_end"] <= run["unallocated_share_at_end"] + 1e-12
    with pytest.raises(ValueError, match="unknown placement policy 'tetris'"):
        run_experiment(ONE_NODE, tasks, ExperimentSettings(policies=("tetris",)))
    with pytest.raises(ValueError, match="repeats"):
        run_experiment(ONE_NODE, tasks, ExperimentSettings(repeats=0))
