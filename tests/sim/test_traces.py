"""Trace readers on small files written here, plus read-only checks on the bundled public data."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from corral.core.job import JobSpec, Priority
from corral.sim.perfmodel import DEFAULT_SPREAD_SLOWDOWNS, PerfModel
from corral.sim.traces import FORMATS, Trace, TraceError, load_trace, stream_trace, synthetic
from corral.sim.traces.base import _moved
from corral.sim.traces.synthetic import GAVEL_MSR_GPU_COUNTS, MIX_MODELS

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
RESNET = "ResNet-18 (batch size 16)"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(spec: str, **kw) -> str:
    with pytest.raises(TraceError) as error:
        load_trace(spec, **kw)
    message = str(error.value)
    assert "\n" not in message, message
    return message


def offered_load(trace: Trace, gpus: int) -> float:
    span = trace.jobs[-1].submit_time - trace.jobs[0].submit_time
    work = sum(spec.gpus * spec.duration_s for spec in trace.jobs)
    return work / (gpus * span)


# -- load_trace ---------------------------------------------------------------------------------


def test_unknown_format_lists_the_known_ones():
    message = error_of("slurm:/tmp/x")
    assert "unknown trace format 'slurm'" in message
    for name in FORMATS:
        assert name in message


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.csv"
    assert error_of(f"tiresias:{missing}") == f"{missing}: no such file or directory"
    assert "no path given" in error_of("tiresias:")


# -- tiresias -----------------------------------------------------------------------------------

TIRESIAS_HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"


def test_tiresias_sorts_shifts_and_keeps_file_order_on_ties(tmp_path):
    file = write(
        tmp_path / "jobs.csv",
        TIRESIAS_HEADER
        + "a,1,100,10,vgg19,50,0\n"
        + "b,8,40,10,resnet50,70,0\n"
        + "\n"
        + "c,2,100,10,vgg16,30,0\n",
    )
    trace = load_trace(f"tiresias:{file}")
    assert [j.id for j in trace.jobs] == ["b", "a", "c"]
    assert [j.submit_time for j in trace.jobs] == [0.0, 60.0, 60.0]
    b, a, c = trace.jobs
    assert (b.gpus, b.duration_s, b.model, b.total_steps) == (8, 70.0, "resnet50", 10.0)
    assert b.spread_slowdown == DEFAULT_SPREAD_SLOWDOWNS["resnet"]
    assert a.spread_slowdown == 1.0  # one GPU cannot be spread
    assert c.spread_slowdown == DEFAULT_SPREAD_SLOWDOWNS["vgg"]
    assert trace.source == f"tiresias:{file}"


def test_tiresias_uses_the_given_perf_model(tmp_path):
    file = write(tmp_path / "jobs.csv", TIRESIAS_HEADER + "a,4,0,10,vgg19,50,0\n")
    perf = PerfModel.default_for_durations().with_overrides({"vgg19": 2.5})
    assert load_trace(f"tiresias:{file}", perf=perf).jobs[0].spread_slowdown == 2.5


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("a,x,0,10,vgg19,50,0", "line 3: num_gpu: must be a positive integer, got 'x'"),
        ("a,0,0,10,vgg19,50,0", "line 3: num_gpu: must be a positive integer, got '0'"),
        ("a,1.5,0,10,vgg19,50,0", "line 3: num_gpu: must be a positive integer, got '1.5'"),
        ("a,1,-5,10,vgg19,50,0", "line 3: submit_time: must be a non-negative number, got '-5'"),
        ("a,1,0,10,vgg19,nan,0", "line 3: duration: must be a positive number, got 'nan'"),
        ("a,1,0,10,vgg19,inf,0", "line 3: duration: must be a positive number, got 'inf'"),
        ("a,1,0,10,vgg19,0,0", "line 3: duration: must be a positive number, got '0'"),
        ("a,1,0,10,vgg19,50", "line 3: expected 7 columns, got 6"),
        ("x,1,0,10,vgg19,50,0", "line 3: id: duplicate job id 'x' (first at line 2)"),
    ],
)
def test_tiresias_errors_name_file_line_and_field(tmp_path, row, expected):
    file = write(tmp_path / "t.csv", TIRESIAS_HEADER + "x,1,0,10,vgg19,50,0\n" + row + "\n")
    assert error_of(f"tiresias:{file}") == f"{file}: {expected}"


def test_tiresias_header_and_emptiness(tmp_path):
    file = write(tmp_path / "t.csv", "job_id,submit_time,duration\n1,0,5\n")
    assert error_of(f"tiresias:{file}") == f"{file}: line 1: header: missing column(s) num_gpu"
    empty = write(tmp_path / "empty.csv", TIRESIAS_HEADER)
    assert "has no jobs" in error_of(f"tiresias:{empty}")
    blank = write(tmp_path / "blank.csv", "")
    assert "empty file" in error_of(f"tiresias:{blank}")


def test_arrival_scale_multiplies_every_gap(tmp_path):
    file = write(
        tmp_path / "t.csv", TIRESIAS_HEADER + "a,1,10,1,m,5,0\nb,1,30,1,m,5,0\nc,1,110,1,m,5,0\n"
    )
    assert [j.submit_time for j in load_trace(f"tiresias:{file}", arrival_scale=0.5).jobs] == [
        0.0,
        10.0,
        50.0,
    ]
    assert "arrival_scale" in error_of(f"tiresias:{file}", arrival_scale=0)
    assert "arrival_scale" in error_of(f"tiresias:{file}", arrival_scale=float("nan"))


def test_a_streamed_trace_starts_at_zero_its_gaps_scaled(tmp_path):
    file = write(
        tmp_path / "t.csv", TIRESIAS_HEADER + "a,1,17,1,m,5,0\nb,2,31,1,m,5,0\nc,1,31,1,m,5,0\n"
    )
    jobs = list(stream_trace(f"tiresias:{file}", arrival_scale=2.0).jobs)
    assert [(j.id, j.submit_time, j.gpus) for j in jobs] == [
        ("a", 0.0, 1),
        ("b", 28.0, 2),
        ("c", 28.0, 1),
    ]


def test_a_moved_spec_is_the_spec_replaced_its_deadline_as_far_from_it():
    spec = JobSpec(
        id="j",
        submit_time=100.0,
        gpus=1,
        user="ann",
        vc="vision",
        model="resnet50",
        gpu_types=frozenset({"v100"}),
        duration_s=60.0,
        total_steps=600.0,
        spread_slowdown=1.5,
        priority=Priority.OPPORTUNISTIC,
        max_retries=2,
        deadline=250.0,
        gpus_per_worker=1,
        checkpoint_every_s=30.0,
        gpu_milli=500,  # a share: `plain` is False, and stays so
        precheck_s=5.0,
        level=3,
        time_limit_s=90.0,
    )
    moved = _moved(spec, 40.0)
    assert moved == dataclasses.replace(spec, submit_time=40.0, deadline=190.0)
    assert [getattr(moved, name) for name in JobSpec.__slots__] == [
        40.0 if name == "submit_time" else 190.0 if name == "deadline" else getattr(spec, name)
        for name in JobSpec.__slots__
    ]
    assert moved.plain is False and spec.submit_time == 100.0  # the spec itself is left alone
    assert _moved(dataclasses.replace(spec, deadline=None), 40.0).deadline is None


def test_unknown_options_are_refused(tmp_path):
    file = write(tmp_path / "t.csv", TIRESIAS_HEADER + "a,1,0,1,m,5,0\n")
    assert error_of(f"tiresias:{file}", colour="blue") == "tiresias: unknown option(s) colour"


# -- philly -------------------------------------------------------------------------------------


def attempt(start, end, *machines):
    return {
        "start_time": start,
        "end_time": end,
        "detail": [{"ip": ip, "gpus": list(gpus)} for ip, gpus in machines],
    }


def philly_job(jobid, submitted, attempts, status="Pass", vc="vc1", user="alice"):
    return {
        "status": status,
        "vc": vc,
        "jobid": jobid,
        "user": user,
        "submitted_time": submitted,
        "attempts": attempts,
    }


def test_philly_replays_the_last_attempt(tmp_path):
    jobs = [
        # Failed once on 2 GPUs, then ran 30 minutes on 4 GPUs over two machines (one GPU listed
        # twice: still 4 distinct GPUs).
        philly_job(
            "app_1",
            "2017-10-01 10:00:00",
            [
                attempt("2017-10-01 10:05:00", "2017-10-01 10:06:00", ("m1", ["gpu0", "gpu1"])),
                attempt(
                    "2017-10-01 11:00:00",
                    "2017-10-01 11:30:00",
                    ("m1", ["gpu0", "gpu1", "gpu1"]),
                    ("m2", ["gpu0", "gpu1"]),
                ),
            ],
            status="Failed",
            vc="vc2",
            user="bob",
        ),
        philly_job(
            "app_2",
            "2017-10-01 09:59:00",
            [
                attempt("2017-10-01 10:00:00", "2017-10-01 10:00:10", ("m3", ["gpu3"])),
            ],
        ),
        philly_job(
            "app_3",
            "2017-10-01 10:30:00",
            [
                attempt("2017-10-01 10:31:00", None, ("m3", ["gpu0"])),
            ],
        ),
        philly_job("app_4", "2017-10-01 10:40:00", [], status="Killed"),
        philly_job(
            "app_5",
            "2017-10-01 10:50:00",
            [
                attempt("2017-10-01 10:51:00", "2017-10-01 12:51:00", ("m4", ["gpu0"])),
            ],
            status="Killed",
        ),
    ]
    file = write(tmp_path / "cluster_job_log", json.dumps(jobs))
    trace = load_trace(f"philly:{file}")
    assert [j.id for j in trace.jobs] == ["app_2", "app_1", "app_5"]
    by_id = {j.id: j for j in trace.jobs}
    first = by_id["app_1"]
    assert (first.gpus, first.duration_s, first.submit_time) == (4, 1800.0, 60.0)
    assert (first.vc, first.user) == ("vc2", "bob")
    assert by_id["app_2"].duration_s == 10.0
    assert by_id["app_5"].submit_time == 51 * 60.0 and by_id["app_5"].duration_s == 7200.0
    # Every status is replayed; ties in the count keep the order first seen in the file.
    assert trace.notes[0] == "replayed jobs by status: 1 Failed, 1 Pass, 1 Killed"
    assert "skipped 1 job: unfinished (last attempt has no end_time)" in trace.notes
    assert "skipped 1 job: never started (no attempts)" in trace.notes


def test_philly_uses_the_last_attempt_with_both_times(tmp_path):
    jobs = [
        philly_job(
            "a",
            "2017-10-01 10:00:00",
            [
                attempt("2017-10-01 10:00:00", "2017-10-01 10:20:00", ("m1", ["gpu0"])),
                attempt(None, "2017-10-01 10:30:00", ("m1", ["gpu0", "gpu1"])),
            ],
        )
    ]
    file = write(tmp_path / "log.json", json.dumps(jobs))
    (job,) = load_trace(f"philly:{file}").jobs
    assert (job.gpus, job.duration_s) == (2, 1200.0)


def test_philly_errors_name_the_job_and_field(tmp_path):
    file = write(
        tmp_path / "log.json",
        json.dumps(
            [
                philly_job(
                    "a",
                    "2017-10-01 10:00:00",
                    [attempt("2017-10-01 10:00:00", "2017-10-01 10:20:00", ("m", ["gpu0"]))],
                ),
                philly_job("b", "yesterday", []),
            ]
        ),
    )
    assert error_of(f"philly:{file}") == (
        f"{file}: job 1 (b): submitted_time: must be a time like 2017-10-03 14:05:00, "
        "got 'yesterday'"
    )
    file.write_text(
        json.dumps(
            [
                philly_job(
                    "a",
                    "2017-10-01 10:00:00",
                    [attempt("2017-10-01 10:00:00", "10:20", ("m", ["gpu0"]))],
                )
            ]
        )
    )
    assert error_of(f"philly:{file}") == (
        f"{file}: job 0 (a): attempts[0]: end_time: must be a time like 2017-10-03 14:05:00, "
        "got '10:20'"
    )
    file.write_text(
        json.dumps(
            [
                {
                    "jobid": "a",
                    "submitted_time": "2017-10-01 10:00:00",
                    "attempts": [{"start_time": None, "end_time": None, "detail": "m1"}],
                }
            ]
        )
    )
    assert error_of(f"philly:{file}") == (
        f"{file}: job 0 (a): attempts[0]: detail: must be a list, got str"
    )
    file.write_text('[{"jobid": "a",\n  oops}]')
    assert error_of(f"philly:{file}").startswith(f"{file}: line 2: not valid JSON")
    file.write_text('{"jobid": "a"}')
    assert error_of(f"philly:{file}") == f"{file}: expected a JSON list of jobs at the top level"


def test_philly_with_only_unfinished_jobs_is_empty(tmp_path):
    file = write(tmp_path / "log.json", json.dumps([philly_job("a", "2017-10-01 10:00:00", [])]))
    message = error_of(f"philly:{file}")
    assert "has no jobs" in message and "never started" in message


# -- gavel --------------------------------------------------------------------------------------


def gavel_line(job_type, steps, arrival, gpus):
    return f"{job_type}\tcd x && python3 train.py\t--steps\t1\t{steps}\t{arrival:.6f}\t{gpus}\n"


def write_gavel_table(path: Path) -> Path:
    table = {
        "v100": {str((RESNET, 1)): {"null": 20.0}, str((RESNET, 4)): {"null": 50.0}},
        "v100_unconsolidated": {str((RESNET, 4)): {"null": 25.0}},
    }
    return write(path, json.dumps(table))


def test_gavel_directory_uses_the_table_beside_it(tmp_path):
    write_gavel_table(tmp_path / "simulation_throughputs.json")
    traces = tmp_path / "seed0"
    write(traces / "vcb.trace", gavel_line(RESNET, 1000, 5, 1) + gavel_line(RESNET, 500, 2, 4))
    write(traces / "vca.trace", gavel_line(RESNET, 100, 3, 8))
    write(traces / "README", "not a trace")
    trace = load_trace(f"gavel:{traces}")
    assert [j.id for j in trace.jobs] == ["vcb-2", "vca-1", "vcb-1"]
    vcb2, vca1, vcb1 = trace.jobs
    assert [j.submit_time for j in trace.jobs] == [0.0, 1.0, 3.0]
    assert (vcb1.vc, vcb1.model, vcb1.gpus, vcb1.total_steps) == ("vcb", RESNET, 1, 1000.0)
    assert vcb1.duration_s == pytest.approx(1000 / 20.0)
    assert vcb2.duration_s == pytest.approx(500 / 50.0)
    assert vcb2.spread_slowdown == pytest.approx(2.0)
    # 8 GPUs: scaled from the 4-GPU measurement (100 steps/s consolidated, 50 spread).
    assert vca1.duration_s == pytest.approx(100 / 100.0)
    assert vca1.spread_slowdown == pytest.approx(2.0)
    assert trace.perf is not None and trace.perf.has_throughputs


def test_gavel_single_file_table_option_and_perf_without_throughputs(tmp_path):
    table = write_gavel_table(tmp_path / "elsewhere" / "t.json")
    file = write(tmp_path / "traces" / "vc.trace", gavel_line(RESNET, 40, 0, 1))
    assert "throughput table" in error_of(f"gavel:{file}")
    (job,) = load_trace(f"gavel:{file}", table=str(table)).jobs
    assert job.duration_s == pytest.approx(2.0)
    # A perf model with a table is used as is; one without borrows the table next to the traces
    # but keeps its slowdowns.
    (job,) = load_trace(f"gavel:{file}", perf=PerfModel.from_gavel_table(table)).jobs
    assert job.duration_s == pytest.approx(2.0)
    write_gavel_table(tmp_path / "simulation_throughputs.json")
    trace = load_trace(
        f"gavel:{file}", perf=PerfModel.default_for_durations().with_overrides({"x": 2.0})
    )
    assert trace.jobs[0].duration_s == pytest.approx(2.0)
    assert trace.perf is not None and trace.perf.slowdowns["x"] == 2.0


def test_gavel_errors_name_file_line_and_field(tmp_path):
    write_gavel_table(tmp_path / "simulation_throughputs.json")
    file = tmp_path / "traces" / "vc.trace"
    write(file, gavel_line(RESNET, 40, 0, 1) + gavel_line("GPT-5 (batch size 1)", 40, 0, 1))
    assert error_of(f"gavel:{file}") == (
        f"{file}: line 2: job_type: no v100 throughput for 'GPT-5 (batch size 1)' in the "
        "throughput table"
    )
    write(file, gavel_line(RESNET, 40, 0, "two"))
    assert error_of(f"gavel:{file}") == (
        f"{file}: line 1: scale_factor: must be a positive integer, got 'two'"
    )
    write(file, gavel_line(RESNET, -40, 0, 1))
    assert error_of(f"gavel:{file}") == (
        f"{file}: line 1: total_steps: must be a positive number, got '-40'"
    )
    write(file, "ResNet\t1\t2\n")
    assert error_of(f"gavel:{file}") == f"{file}: line 1: expected 7 tab-separated columns, got 3"
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert error_of(f"gavel:{empty_dir}") == f"{empty_dir}: no .trace files in this directory"


# -- alibaba ------------------------------------------------------------------------------------

OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_alibaba_openb_pods(tmp_path):
    file = write(
        tmp_path / "pods.csv",
        OPENB_HEADER
        + "p0,1000,1024,1,1000,,LS,Running,100,700,200\n"
        + "p1,1000,1024,0,0,,BE,Running,110,500,120\n"  # CPU-only
        + "p2,1000,1024,1,460,,BE,Failed,120,400,150\n"  # a fraction of one GPU
        + "p3,1000,1024,8,1000,V100M16|V100M32,LS,Succeeded,130,1130,130\n"
        + "p4,1000,1024,2,1000,,BE,Pending,140,150,\n",
    )  # never scheduled
    trace = load_trace(f"alibaba:{file}")
    assert [j.id for j in trace.jobs] == ["p0", "p2", "p3"]
    p0, p2, p3 = trace.jobs
    assert (p0.submit_time, p0.duration_s, p0.gpus, p0.gpu_types) == (0.0, 500.0, 1, None)
    assert (p2.submit_time, p2.duration_s, p2.gpus) == (20.0, 250.0, 1)
    assert (p3.gpus, p3.duration_s, p3.gpu_types) == (8, 1000.0, frozenset({"v100m16", "v100m32"}))
    assert "skipped 1 CPU-only record (num_gpu 0)" in trace.notes
    assert any(n.startswith("skipped 1 record without a positive duration") for n in trace.notes)
    assert any(n.startswith("gave one whole GPU to 1 task that") for n in trace.notes)


def test_alibaba_without_time_columns(tmp_path):
    file = write(
        tmp_path / "multigpu.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        "p0,1000,1024,1,1000\np1,1000,1024,4,1000\np2,1000,1024,0,0\n",
    )
    trace = load_trace(f"alibaba:{file}")
    assert [(j.id, j.gpus, j.submit_time, j.duration_s) for j in trace.jobs] == [
        ("p0", 1, 0.0, None),
        ("p1", 4, 0.0, None),
    ]
    assert any("no creation/deletion times" in n for n in trace.notes)


def test_alibaba_errors(tmp_path):
    file = write(tmp_path / "pods.csv", OPENB_HEADER + "p0,1000,1024,-1,1000,,LS,Running,0,9,1\n")
    assert error_of(f"alibaba:{file}") == (
        f"{file}: line 2: num_gpu: must be a non-negative integer, got '-1'"
    )
    write(file, OPENB_HEADER + "p0,1000,1024,1,1000,,LS,Running,soon,9,1\n")
    assert error_of(f"alibaba:{file}") == (
        f"{file}: line 2: creation_time: must be a non-negative number, got 'soon'"
    )


# -- helios -------------------------------------------------------------------------------------

HELIOS_HEADER = (
    "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue\n"
)


def test_helios_numeric_and_timestamp_times(tmp_path):
    file = write(
        tmp_path / "cluster_log.csv",
        HELIOS_HEADER
        + "j1,u1,vcA,8,48,1,COMPLETED,2020-04-01 08:00:00,2020-04-01 08:00:10,"
        + "2020-04-01 09:00:10,3600,10\n"
        + "j2,u2,vcB,0,4,1,COMPLETED,2020-04-01 08:00:05,2020-04-01 08:00:06,"
        + "2020-04-01 08:10:00,594,1\n"
        + "j3,u2,vcB,2,4,1,FAILED,2020-04-01 07:59:00,2020-04-01 08:00:00,"
        + "2020-04-01 08:02:00,,60\n"
        + "j4,u3,vcB,1,4,1,CANCELLED,2020-04-01 08:30:00,,,0,0\n",
    )
    trace = load_trace(f"helios:{file}")
    assert [j.id for j in trace.jobs] == ["j3", "j1"]
    j3, j1 = trace.jobs
    assert (j3.submit_time, j3.duration_s, j3.gpus, j3.user, j3.vc) == (0.0, 120.0, 2, "u2", "vcB")
    assert (j1.submit_time, j1.duration_s, j1.gpus) == (60.0, 3600.0, 8)
    assert "skipped 1 CPU-only job (gpu_num 0)" in trace.notes
    assert "skipped 1 job without a positive run time" in trace.notes

    numeric = write(
        tmp_path / "numeric.csv",
        HELIOS_HEADER
        + "a,u,v,1,1,1,COMPLETED,1000,1010,1110,100,10\n"
        + "b,u,v,4,1,1,COMPLETED,1500.5,1600,1700,,100\n",
    )
    trace = load_trace(f"helios:{numeric}")
    assert [(j.id, j.submit_time, j.duration_s) for j in trace.jobs] == [
        ("a", 0.0, 100.0),
        ("b", 500.5, 100.0),
    ]


def test_helios_errors(tmp_path):
    file = write(tmp_path / "log.csv", HELIOS_HEADER + "a,u,v,one,1,1,COMPLETED,0,0,5,5,0\n")
    assert error_of(f"helios:{file}") == (
        f"{file}: line 2: gpu_num: must be a non-negative integer, got 'one'"
    )
    write(file, HELIOS_HEADER + "a,u,v,1,1,1,COMPLETED,April,0,5,5,0\n")
    assert error_of(f"helios:{file}").startswith(f"{file}: line 2: submit_time: must be")
    write(file, "job_id,gpu_num,submit_time\na,1,0\n")
    assert error_of(f"helios:{file}") == (
        f"{file}: line 1: header: missing column(s) duration or start_time and end_time"
    )


# -- corral -------------------------------------------------------------------------------------

CORRAL_HEADER = '{"kind": "trace", "version": 1, "time_origin": 1000.0}\n'


def test_corral_reads_nodes_jobs_and_its_throughput_table(tmp_path):
    (tmp_path / "h.throughputs.json").write_text(
        json.dumps(
            {"a100": {"('resnet', 1)": {"null": 8.0}}, "v100": {"('resnet', 1)": {"null": 2.0}}}
        )
    )
    file = write(
        tmp_path / "h.corral.jsonl",
        '{"kind": "trace", "version": 1, "time_origin": 1000.0, "throughputs": "h.throughputs.json"}\n'
        '{"kind": "node", "name": "a1", "gpus": 4, "gpu_type": "A100", "rack": "r0"}\n'
        "\n"
        '{"kind": "job", "id": "2", "submit_time": 30, "gpus": 2, "duration_s": 50, '
        '"deadline": 130, "model": "resnet", "status": "CANCELLED"}\n'
        '{"kind": "node", "name": "v1", "gpus": 2, "gpu_type": "v100", "rack": "r1"}\n'
        '{"kind": "job", "id": "1", "submit_time": 10, "gpus": 1, "duration_s": 20.5, '
        '"user": "alice", "vc": "vision", "gpu_types": ["V100"], "status": "SUCCEEDED"}\n',
    )
    for spec in (f"corral:{file}", str(file)):  # a .corral.jsonl path needs no format
        trace = load_trace(spec, arrival_scale=2.0)
        assert [j.id for j in trace.jobs] == ["1", "2"]
        first, second = trace.jobs
        assert (first.submit_time, first.duration_s, first.user, first.vc) == (
            0.0,
            20.5,
            "alice",
            "vision",
        )
        assert first.gpu_types == frozenset({"v100"})
        # Shifted and scaled like any trace; the deadline keeps its distance from its submission.
        assert (second.submit_time, second.deadline, second.model) == (40.0, 140.0, "resnet")
        assert [(n.name, n.gpus, n.gpu_type, n.rack) for n in trace.nodes] == [
            ("a1", 4, "a100", "r0"),
            ("v1", 2, "v100", "r1"),
        ]
        assert trace.config_replaces_nodes
        assert trace.profiles is not None and trace.profiles.rate("resnet", "v100", 1) == 2.0
        assert "jobs by status where they ran: 1 CANCELLED, 1 SUCCEEDED" in trace.notes
    bare = write(
        tmp_path / "bare.corral.jsonl",
        CORRAL_HEADER + '{"kind": "job", "id": "a", "submit_time": 0, "gpus": 1}\n',
    )
    trace = load_trace(f"corral:{bare}")
    assert trace.nodes is None and trace.profiles is None and trace.jobs[0].duration_s is None


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            '{"kind": "job", "id": "a", "submit_time": 0, "gpus": 1}\n',
            'line 1: kind: the first line must be the header {"kind": "trace"}',
        ),
        (
            CORRAL_HEADER + '{"kind": "job", "id": "a", "submit_time": 0, "gpus": -1}\n',
            "line 2: gpus: must be an integer >= 0, got -1",
        ),
        (
            CORRAL_HEADER + '{"kind": "job", "id": "a", "submit_time": 0, "gpus": 1, "gpus": 2}\n',
            "line 2: gpus: given twice",
        ),
        (
            CORRAL_HEADER + '{"kind": "job", "id": "a", "submit_time": NaN, "gpus": 1}\n',
            "line 2: not a JSON object: NaN is not a JSON number",
        ),
        (CORRAL_HEADER + "[1, 2]\n", "line 2: record: expected a JSON object, got [1, 2]"),
        (CORRAL_HEADER + '{"kind": "job"\n', "line 2: not a JSON object: Expecting"),
        (
            CORRAL_HEADER
            + '{"kind": "node", "name": "n", "gpus": 2}\n{"kind": "node", "name": "n", "gpus": 4}\n',
            "line 3: name: duplicate node 'n' (first at line 2)",
        ),
        (
            CORRAL_HEADER + '{"kind": "job", "id": "a", "submit_time": 0, "gpus": 1}\n'
            '{"kind": "job", "id": "a", "submit_time": 5, "gpus": 1}\n',
            "line 3: id: duplicate job id 'a' (first at line 2)",
        ),
        (
            '{"kind": "trace", "version": 1, "throughputs": "gone.json"}\n',
            "line 1: throughputs: no such file",
        ),
        ("\n", 'empty (expected a header line {"kind": "trace", ...})'),
    ],
)
def test_corral_errors_name_file_line_and_field(tmp_path, lines, expected):
    file = write(tmp_path / "bad.corral.jsonl", lines)
    assert error_of(f"corral:{file}").startswith(f"{file}: {expected}")


def test_corral_refuses_a_bad_throughput_table_naming_it(tmp_path):
    table = write(tmp_path / "t.json", json.dumps({"v100": {"('resnet', 1)": {"null": "fast"}}}))
    file = write(
        tmp_path / "x.corral.jsonl", '{"kind": "trace", "version": 1, "throughputs": "t.json"}\n'
    )
    assert error_of(f"corral:{file}") == (
        f"{table}: v100: ('resnet', 1): null: steps/s must be a finite number >= 0, got 'fast'"
    )


# -- synthetic ----------------------------------------------------------------------------------


@pytest.fixture
def runtimes(tmp_path: Path) -> Path:
    # A spread of run times, with zero and negative ones that must be dropped.
    values = [0, -5] + [60 * (1 + (i * 37) % 500) for i in range(2000)]
    return write(tmp_path / "runtime.csv", "runtime\n" + "\n".join(str(v) for v in values) + "\n")


def test_synthetic_is_deterministic_per_seed(runtimes):
    spec = f"synthetic:jobs=300,runtimes={runtimes}"
    first, again = load_trace(spec, seed=4), load_trace(spec, seed=4)
    assert first.jobs == again.jobs
    assert load_trace(spec, seed=5).jobs != first.jobs
    assert load_trace(spec + ",seed=4", seed=99).jobs == first.jobs
    assert all(j.duration_s > 0 for j in first.jobs)
    assert [j.id for j in first.jobs] == [f"syn-{i:06d}" for i in range(300)]


def test_synthetic_offered_load_and_gpu_mix(runtimes):
    for load in (0.5, 0.9, 1.5):
        trace = load_trace(f"synthetic:jobs=5000,load={load},gpus=256,runtimes={runtimes}")
        assert offered_load(trace, 256) == pytest.approx(load, rel=0.15)
    counts = Counter(j.gpus for j in trace.jobs)
    total = sum(GAVEL_MSR_GPU_COUNTS.values())
    assert counts[1] / 5000 == pytest.approx(GAVEL_MSR_GPU_COUNTS[1] / total, abs=0.03)
    assert counts[8] / 5000 == pytest.approx(GAVEL_MSR_GPU_COUNTS[8] / total, abs=0.02)
    assert set(counts) <= set(GAVEL_MSR_GPU_COUNTS)


def test_synthetic_arrival_scale_halves_the_span(runtimes):
    spec = f"synthetic:jobs=200,runtimes={runtimes}"
    normal, fast = load_trace(spec), load_trace(spec, arrival_scale=0.5)
    assert fast.jobs[-1].submit_time == pytest.approx(normal.jobs[-1].submit_time / 2)
    assert [j.duration_s for j in fast.jobs] == [j.duration_s for j in normal.jobs]


def test_synthetic_cap_and_models(runtimes):
    trace = load_trace(f"synthetic:jobs=2000,max_gpus=4,models=mix,runtimes={runtimes}")
    assert max(j.gpus for j in trace.jobs) == 4
    assert {j.model for j in trace.jobs} == set(MIX_MODELS)
    vgg = [j for j in trace.jobs if j.model.startswith("vgg") and j.gpus > 1]
    assert vgg and all(j.spread_slowdown == DEFAULT_SPREAD_SLOWDOWNS["vgg"] for j in vgg)
    plain = load_trace(f"synthetic:jobs=50,runtimes={runtimes}")
    assert all(j.model == "" and j.spread_slowdown == 1.0 for j in plain.jobs)


def test_synthetic_needs_no_data_file_and_draws_philly_run_times(tmp_path, monkeypatch):
    # A user's fresh clone: nothing beside the working directory, and the shared data's run-time
    # file nowhere to be found (the generator used to read it from there, and stopped without).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(synthetic, "default_runtime_paths", lambda: [tmp_path / "none.csv"])
    trace = load_trace("synthetic:jobs=20000,load=0.8,gpus=512", seed=3)
    assert "run times of Philly's (the fitted table)" in trace.notes[0]
    durations = sorted(j.duration_s for j in trace.jobs)
    # The fitted table's rows (from philly_runtime.csv): p10 61 s, p25 131 s, p50 1,186 s,
    # p90 12,860 s. 20,000 draws put each sample quantile within about 1 % of its p, which
    # around these rows is within a few percent of the run time.
    for p, seconds in ((0.10, 61), (0.25, 131), (0.50, 1186), (0.90, 12860)):
        assert durations[int(p * len(durations))] == pytest.approx(seconds, rel=0.08), p
    assert 1 <= durations[0] and durations[-1] <= 4_628_239  # the data's shortest and longest
    assert offered_load(trace, 512) == pytest.approx(0.8, rel=0.05)  # rate set from the trace
    # Deterministic per seed, as from a file.
    assert load_trace("synthetic:jobs=20000,load=0.8,gpus=512", seed=3).jobs == trace.jobs


def test_synthetic_key_errors(runtimes, tmp_path):
    assert error_of(f"synthetic:jobs=10,colour=red,runtimes={runtimes}").startswith(
        "synthetic: unknown key(s) colour (known: jobs, load"
    )
    assert error_of(f"synthetic:load=-1,runtimes={runtimes}") == (
        "synthetic: load: must be a positive number, got '-1'"
    )
    assert error_of(f"synthetic:jobs=ten,runtimes={runtimes}") == (
        "synthetic: jobs: must be a positive integer, got 'ten'"
    )
    assert error_of("synthetic:jobs") == "synthetic: 'jobs': expected KEY=VALUE"
    missing = tmp_path / "none.csv"
    assert (
        error_of(f"synthetic:runtimes={missing}")
        == f"{missing}: no such file (synthetic: runtimes)"
    )
    bad = write(tmp_path / "bad.csv", "runtime\n5\nlong\n")
    assert error_of(f"synthetic:runtimes={bad}") == (
        f"{bad}: line 3: runtime: must be a number, got 'long'"
    )


# -- the bundled public data, read-only ----------------------------------------------------------


def shared(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_real_tiresias_60_jobs():
    trace = load_trace(f"tiresias:{shared('tiresias', '60_job.csv')}")
    assert len(trace.jobs) == 60
    first = trace.jobs[0]
    assert (first.id, first.gpus, first.model, first.duration_s) == ("0", 1, "vgg19", 164.0)


def test_real_gavel_trace_durations_match_the_table():
    table_path = shared("gavel-msr", "simulation_throughputs.json")
    seed0 = shared("gavel-msr", "seed0")
    table = json.loads(table_path.read_text())
    trace = load_trace(f"gavel:{seed0}")
    assert len(trace.jobs) == 15264
    by_id = {j.id: j for j in trace.jobs}
    first_line = (seed0 / "0e4a51.trace").read_text().splitlines()[0].split("\t")
    job = by_id["0e4a51-1"]
    thr = table["v100"][str((first_line[0], int(first_line[6])))]["null"]
    assert job.model == first_line[0]
    assert job.duration_s == pytest.approx(float(first_line[4]) / thr)
    assert Counter(j.gpus for j in trace.jobs) == Counter(GAVEL_MSR_GPU_COUNTS)


def test_real_gavel_resnet18_record(tmp_path):
    table_path = shared("gavel-msr", "simulation_throughputs.json")
    alone = json.loads(table_path.read_text())["v100"][str((RESNET, 1))]["null"]
    file = write(tmp_path / "vc.trace", gavel_line(RESNET, 1000, 0, 1))
    (job,) = load_trace(f"gavel:{file}", table=str(table_path)).jobs
    assert job.duration_s == pytest.approx(1000 / alone)  # 1000 / 32.353... s


def test_real_alibaba_default_pods():
    trace = load_trace(f"alibaba:{shared('alibaba-openb', 'openb_pod_list_default.csv')}")
    assert "skipped 1088 CPU-only records (num_gpu 0)" in trace.notes
    assert all(j.duration_s > 0 for j in trace.jobs)


def test_real_synthetic_from_the_philly_file_matches_the_fitted_default():
    path = shared("philly", "philly_runtime.csv")
    from_file = load_trace(f"synthetic:jobs=20000,load=0.8,gpus=512,runtimes={path}", seed=1)
    assert len(from_file.jobs) == 20000 and f"run times from {path}" in from_file.notes[0]
    assert offered_load(from_file, 512) == pytest.approx(0.8, rel=0.15)
    fitted = load_trace("synthetic:jobs=20000,load=0.8,gpus=512", seed=1)
    # The two samples' CDFs (two-sample Kolmogorov-Smirnov distance): the table's largest gap to
    # the data is 0.8 %; two samples of 20,000 differ by about 1.4 % at the 95th percentile.
    a = sorted(j.duration_s for j in from_file.jobs)
    b = sorted(j.duration_s for j in fitted.jobs)
    gap, i, k = 0.0, 0, 0
    for x in sorted(set(a) | set(b)):
        while i < len(a) and a[i] <= x:
            i += 1
        while k < len(b) and b[k] <= x:
            k += 1
        gap = max(gap, abs(i / len(a) - k / len(b)))
    assert gap < 0.025
