"""The example job specs and the manager's docs agree with the code.

Every examples/jobs/*.yaml is a valid job spec with the values its comments promise; every YAML
block in docs/server.md and docs/job-spec.md parses (a job spec as a job spec, a cluster config as
a cluster config); the refusals table of docs/job-spec.md gives, for each spec, the exact message
the code gives; the fields table lists the model's fields in the model's order (the order in which
refusals are reported); the metric names and API routes that docs/server.md lists are the ones a
real manager serves.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from corral.core.cluster import Cluster, NodeDef
from corral.core.config import parse_cluster_config, vc_gpu_quota
from corral.exec.local import LocalExecutor, worker_envs
from corral.server.api import create_app
from corral.server.manager import Manager
from corral.server.metrics import metrics_text
from corral.server.spec import JobSpecModel, SpecError, argv, load_job_spec_file, parse_job_spec
from corral.server.store import Store

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples" / "jobs").glob("*.yaml"))
SERVER_DOC = REPO / "docs" / "server.md"
SPEC_DOC = REPO / "docs" / "job-spec.md"
DOCS = (SERVER_DOC, SPEC_DOC)


def fenced_blocks(path: Path, language: str) -> list[str]:
    """The bodies of the ```LANGUAGE blocks of a markdown file (indented ones too)."""
    blocks = []
    pattern = re.compile(rf"^( *)```{language}\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
    for match in pattern.finditer(path.read_text(encoding="utf-8")):
        indent = len(match.group(1))
        blocks.append("".join(line[indent:] for line in match.group(2).splitlines(True)))
    return blocks


def table_rows(path: Path, heading: str) -> list[list[str]]:
    """The cells of the first table after `heading` (header and rule rows left out)."""
    text = path.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    rows: list[list[str]] = []
    started = False
    for line in section.splitlines():
        if line.startswith("|"):
            started = True
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append([cell.replace("\\|", "|") for cell in cells])
        elif started:
            break
    return rows[2:]


def code_span(cell: str) -> str:
    match = re.fullmatch(r"`(.*)`", cell)
    assert match is not None, f"not a code span: {cell!r}"
    return match.group(1)


# -- examples/jobs ------------------------------------------------------------------------------


def test_there_are_the_four_examples() -> None:
    assert [path.name for path in EXAMPLES] == [
        "distributed.yaml",
        "retries.yaml",
        "train.yaml",
        "typed.yaml",
    ]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_parses_and_runs_the_training_script_of_the_repo(path: Path) -> None:
    spec = load_job_spec_file(path)
    # Each one runs examples/train.py relative to the project root (where `corral submit`
    # is run from, which becomes the job's workdir), so that script must be there.
    assert "examples/train.py" in " ".join(argv(spec))
    assert (REPO / "examples" / "train.py").is_file()
    assert spec.workdir is None  # the CLI fills in the submitter's directory
    assert spec.gpus % spec.workers == 0


def test_train_example_is_one_gpu_with_a_short_grace() -> None:
    spec = load_job_spec_file(REPO / "examples/jobs/train.yaml")
    assert (spec.name, spec.gpus, spec.workers) == ("train-line", 1, 1)
    assert spec.command == ["python3", "examples/train.py"]
    # YAML numbers become the strings a process environment holds
    assert spec.env == {"TRAIN_STEPS": "300", "STEP_SECONDS": "0.1"}
    assert (spec.signal, spec.grace_seconds, spec.max_retries) == ("SIGTERM", 10.0, 0)


def test_distributed_example_gives_each_of_two_workers_two_gpus() -> None:
    spec = load_job_spec_file(REPO / "examples/jobs/distributed.yaml")
    assert (spec.gpus, spec.workers) == (4, 2)
    # A string command runs through the shell, which expands the variables it echoes.
    assert argv(spec)[:2] == ["/bin/sh", "-c"]
    assert "$CORRAL_LOCAL_GPUS" in argv(spec)[2]
    # What its comment promises, from the executor's own function: every worker sees the four
    # GPUs, and owns "0,1" or "2,3" of them.
    envs = worker_envs("1", 1, [0, 1, 2, 3], spec.workers, "/ckpt", 29500, spec.env)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0,1,2,3", "0,1,2,3"]
    assert [env["CORRAL_LOCAL_GPUS"] for env in envs] == ["0,1", "2,3"]
    assert [env["RANK"] for env in envs] == ["0", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"2"}
    assert envs[0]["TRAIN_STEPS"] == "200"


def test_typed_example_accepts_a100_or_h100_in_lower_case() -> None:
    spec = load_job_spec_file(REPO / "examples/jobs/typed.yaml")
    assert spec.gpu_type == ["a100", "h100"]
    assert (spec.locality, spec.gpus, spec.vc) == ("node", 2, "default")
    assert spec.env["OMP_NUM_THREADS"] == "8"


def test_retries_example_fails_once_and_stops_by_sigint() -> None:
    spec = load_job_spec_file(REPO / "examples/jobs/retries.yaml")
    assert (spec.max_retries, spec.signal, spec.grace_seconds) == (3, "SIGINT", 120.0)
    # examples/train.py fails at step FAIL_AT_STEP only FAIL_TIMES times
    assert (spec.env["FAIL_AT_STEP"], spec.env["FAIL_TIMES"]) == ("20", "1")
    assert int(spec.env["FAIL_AT_STEP"]) < int(spec.env["TRAIN_STEPS"])


# -- YAML in the docs ---------------------------------------------------------------------------


#: Keys of a cluster config that no job spec has, and a config of one node to show them in.
CLUSTER_ONLY_KEYS = {"departments", "maintenance", "health_check", "reservations"}
ONE_NODE = {
    "cell_types": {"NODE": {"child": "a100", "count": 4}},
    "physical_cells": [{"type": "NODE", "names": ["gpu-box"]}],
}


def doc_yaml_blocks() -> list[tuple[str, str]]:
    return [(doc.name, block) for doc in DOCS for block in fenced_blocks(doc, "yaml")]


def test_the_docs_have_yaml_blocks_of_both_kinds() -> None:
    blocks = [block for _, block in doc_yaml_blocks()]
    assert sum("cell_types" in block for block in blocks) >= 1
    assert sum("command" in block for block in blocks) >= 2


@pytest.mark.parametrize(
    ("doc", "block"), doc_yaml_blocks(), ids=lambda value: str(value).split("\n")[0][:30]
)
def test_every_yaml_block_of_the_docs_parses(doc: str, block: str) -> None:
    data = yaml.safe_load(block)
    if data.keys() & CLUSTER_ONLY_KEYS and "cell_types" not in data:
        data = {**ONE_NODE, **data}  # a section of a cluster config, shown alone
    if "cell_types" in data:
        config = parse_cluster_config(data)
        assert len(config.cluster.nodes) == 1, f"{doc}: `corral up` takes one node"
        return
    parse_job_spec(data, doc)  # raises SpecError naming the doc if the spec is refused


def test_the_walkthrough_config_gives_two_vcs_of_two_a100s() -> None:
    (block,) = [b for b in fenced_blocks(SERVER_DOC, "yaml") if "cell_types" in b]
    config = parse_cluster_config(yaml.safe_load(block))
    assert vc_gpu_quota(config) == {"vision": 2, "nlp": 2}
    assert {gpu.gpu_type for gpu in config.cluster.gpus} == {"a100"}
    assert config.cluster.nodes[0].name == "gpu-box"


def test_the_python_examples_of_the_server_doc_compile() -> None:
    blocks = fenced_blocks(SERVER_DOC, "python")
    assert blocks  # the SDK's examples
    for block in blocks:  # (the async client's example awaits at its top level)
        compile(block, "server.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


# -- docs/job-spec.md ---------------------------------------------------------------------------


def refusal_rows() -> list[tuple[str, str]]:
    rows = table_rows(SPEC_DOC, "## Refusals")
    return [(code_span(spec), code_span(message)) for spec, message in rows]


def test_the_refusals_table_is_long_enough_to_mean_something() -> None:
    assert len(refusal_rows()) >= 15


@pytest.mark.parametrize(("spec", "message"), refusal_rows(), ids=lambda value: value[:40])
def test_each_refusal_in_the_doc_is_the_message_the_code_gives(spec: str, message: str) -> None:
    data = yaml.safe_load(spec)
    with pytest.raises(SpecError) as refused:
        parse_job_spec(data)
    assert str(refused.value) == message
    # and the CLI's form names the file first
    with pytest.raises(SpecError) as named:
        parse_job_spec(data, "job.yaml")
    assert str(named.value) == f"job.yaml: {message}"


def test_the_fields_table_lists_the_model_fields_in_order() -> None:
    names = [code_span(row[0]) for row in table_rows(SPEC_DOC, "## Fields")]
    assert names == list(JobSpecModel.model_fields)


def test_the_defaults_in_the_fields_table_are_the_model_defaults() -> None:
    rows = {code_span(row[0]): row[2] for row in table_rows(SPEC_DOC, "## Fields")}
    spec = parse_job_spec({"name": "t", "gpus": 1, "command": "true"})
    assert rows["name"] == rows["gpus"] == rows["command"] == "required"
    assert rows["workers"] == f"`{spec.workers}`"
    assert rows["priority"] == f"`{spec.priority}`"
    assert rows["locality"] == f"`{spec.locality}`"
    assert rows["env"] == "`{}`" and spec.env == {}
    assert rows["max_retries"] == f"`{spec.max_retries}`"
    assert rows["signal"] == f"`{spec.signal}`"
    assert rows["grace_seconds"] == f"`{spec.grace_seconds:g}`"
    assert spec.vc == "default" and "`default`" in rows["vc"]


# -- docs/server.md against a real manager --------------------------------------------------------


@pytest.fixture
def manager(tmp_path: Path) -> Manager:
    cluster = Cluster.from_nodes([NodeDef(name="box", gpus=2, gpu_type="gpu")])
    store = Store(Store.sqlite_url(tmp_path))
    built = Manager(store, LocalExecutor(), cluster, tmp_path)
    built.step()  # one scheduling round
    return built


def test_the_metrics_table_names_exactly_the_metrics_served(manager: Manager) -> None:
    """corral's own metrics, one row each; prometheus_client's process and platform metrics
    (`process_*`, `python_*`) in one row."""
    documented: set[str] = set()
    for row in table_rows(SERVER_DOC, "## Monitoring"):
        documented.update(re.findall(r"`(corral_[a-z0-9_]+)`", row[0]))
    body, _ = metrics_text(manager)
    served = set(re.findall(r"^# TYPE (\S+) ", body.decode(), re.MULTILINE))
    assert documented == {name for name in served if name.startswith("corral_")}
    assert any(name.startswith("process_") for name in served)


def test_the_api_table_lists_exactly_the_routes_served(manager: Manager) -> None:
    def generic(path: str) -> str:  # `{id}` in the doc is `{job_id}` in the code
        return re.sub(r"\{[^}]*\}", "{}", path)

    documented = set()
    for row in table_rows(SERVER_DOC, "## The REST API"):
        method, path = code_span(row[0]).split(" ", 1)
        documented.add((method, generic(path)))
    app = create_app(manager)
    served = {
        (method, generic(route.path))
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
        and (route.path.startswith("/api/") or route.path in ("/metrics", "/healthz", "/readyz"))
    }
    assert served == {pair for pair in documented if pair[1] != "/"}
    assert ("GET", "/") in documented  # the dashboard, mounted as static files
