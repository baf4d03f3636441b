"""The OpenAPI document lists, for each operation, exactly the statuses its code can answer.

The statuses are read from the code, not from a list kept beside it: each route's function, the
helpers it calls (transitively) and the token check its `Caller` parameter runs raise
`HTTPException(N, ...)`; a route that turns a `ControlError` into its status (`error.status`)
answers the statuses the manager's controls it calls raise. Beside those, every operation may
answer 422 (parameter validation, NUL characters: the middleware), 503 (the store unavailable) and,
with a body, 413 (over the size limit). A status raised but not documented is a lie a
schema-driven client trips on (schemathesis finds some, by chance: tests/server/test_api_fuzz.py);
one documented but never raised is a promise the code does not keep.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from corral.core.cluster import Cluster, NodeDef
from corral.exec.local import LocalExecutor
from corral.server.api import create_app
from corral.server.manager import Manager
from corral.server.store import Store
from tests.server.helpers import REPO

SERVER = REPO / "corral" / "server"
ROUTE_METHODS = ("get", "post", "put", "patch", "delete")
#: What any operation may answer whatever its code: validation (FastAPI's, the middleware's NUL
#: check), the store being unavailable.
EVERYWHERE = {"422", "503"}


def functions(tree: ast.AST) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of a module by name, nested ones (create_app's routes) included."""
    return {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not those of functions defined inside it."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def raised_with(node: ast.AST, exception: str) -> ast.expr | None:
    """The status argument of a call `exception(status, ...)`, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == exception
        and node.args
    ):
        return node.args[0]
    return None


def control_statuses() -> dict[str, set[str]]:
    """The statuses of the ControlErrors each of the manager's controls raises (its job
    controls, its node controls and its reservations)."""
    found: dict[str, set[str]] = {}
    for module in ("controls.py", "nodes.py", "reservations.py"):
        found |= module_control_statuses(module)
    return found


def module_control_statuses(module: str) -> dict[str, set[str]]:
    tree = ast.parse((SERVER / module).read_text())
    found: dict[str, set[str]] = {}
    for name, function in functions(tree).items():
        statuses = set()
        for node in own_nodes(function):
            status = raised_with(node, "ControlError")
            if status is not None:
                assert isinstance(status, ast.Constant), f"{module} {name}: a status not given"
                statuses.add(str(status.value))
        found[name] = statuses
    return found


class Statuses:
    """What the functions of one module can raise, calls to the module's helpers followed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.functions = functions(self.tree)
        self.controls = control_statuses()
        self.memo: dict[str, set[str]] = {}

    def of(self, name: str) -> set[str]:
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = set()  # (recursion: what is known so far)
        function = self.functions[name]
        found: set[str] = set()
        for node in own_nodes(function):
            status = raised_with(node, "HTTPException")
            if status is not None:
                found |= self.status_of(name, function, status)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in self.functions:
                    found |= self.of(node.func.id)
        self.memo[name] = found
        return found

    def status_of(self, name: str, function: ast.AST, status: ast.expr) -> set[str]:
        if isinstance(status, ast.Constant):
            return {str(status.value)}
        # `HTTPException(error.status, ...)` of a ControlError: the controls the function calls
        where = f"{self.path.name}:{status.lineno} in {name}"
        assert isinstance(status, ast.Attribute) and status.attr == "status", (
            f"{where}: the status is neither a number nor a ControlError's: teach this test"
        )
        controls = {
            node.attr
            for node in own_nodes(function)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "manager"
            and node.attr in self.controls
        }
        assert controls, f"{where}: a ControlError's status, but no control is called"
        return set().union(*(self.controls[control] for control in controls))

    def routes(self) -> dict[tuple[str, str], set[str]]:
        """(method, path) of each route the module defines: the statuses its code raises."""
        found = {}
        for name, function in self.functions.items():
            for decorator in function.decorator_list:
                if not (
                    isinstance(decorator, ast.Call)
                    and isinstance(decorator.func, ast.Attribute)
                    and decorator.func.attr in ROUTE_METHODS
                    and decorator.args
                    and isinstance(decorator.args[0], ast.Constant)
                ):
                    continue
                statuses = set(self.of(name))
                if any(self.needs_token(arg) for arg in function.args.args):
                    statuses |= self.of("principal")
                found[(decorator.func.attr, decorator.args[0].value)] = statuses
        return found

    @staticmethod
    def needs_token(arg: ast.arg) -> bool:
        return isinstance(arg.annotation, ast.Name) and arg.annotation.id == "Caller"


def raised_by_routes() -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted(SERVER.glob("*.py")):
        found.update(Statuses(path).routes())
    return found


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("openapi")
    cluster = Cluster.from_nodes([NodeDef(name="box", gpus=2, gpu_type="gpu")])
    manager = Manager(Store(Store.sqlite_url(directory)), LocalExecutor(), cluster, directory)
    try:
        return create_app(manager).openapi()
    finally:
        manager.store.close()


def documented(document: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    return {
        (method, path): {status for status in operation["responses"] if status[0] in "45"}
        for path, item in document["paths"].items()
        if path.startswith("/api/")
        for method, operation in item.items()
        if method in ROUTE_METHODS
    }


def test_every_operation_documents_exactly_the_statuses_its_code_answers(
    document: dict[str, Any],
) -> None:
    raised = raised_by_routes()
    listed = documented(document)
    assert set(listed) <= set(raised), "operations the code scan did not find"
    wrong = []
    for operation, statuses in sorted(listed.items()):
        method, _ = operation
        expected = raised[operation] | EVERYWHERE
        if method in ("post", "put", "patch"):
            expected.add("413")  # a body over the limit, refused before the route
        if statuses != expected:
            wrong.append(
                f"{method.upper()} {operation[1]}: documented {sorted(statuses)}, "
                f"answers {sorted(expected)}"
            )
    assert not wrong, "\n".join(wrong)


def test_the_scan_reads_the_statuses_named_in_the_code(document: dict[str, Any]) -> None:
    """The cases the scan must not miss: admins-only export (403), the job controls' conflicts
    (409) through ControlError, a log that is not a regular file (409), and 401 from the token
    check every /api/v1 route runs."""
    raised = raised_by_routes()
    listed = documented(document)
    assert "403" in raised[("get", "/api/v1/export")]
    for verb in ("hold", "release", "requeue"):
        operation = ("post", f"/api/v1/jobs/{{job_id}}/{verb}")
        assert {"403", "404", "409"} <= raised[operation] <= listed[operation]
    assert "409" in raised[("get", "/api/v1/jobs/{job_id}/logs")]
    assert raised[("post", "/api/v1/jobs/{job_id}/requeue")] >= {"404", "409"}
    tokenless = ("/metrics", "/healthz", "/readyz")  # (probes: corral.server.liveness)
    assert all("401" in statuses for (_, path), statuses in raised.items() if path not in tokenless)
    assert all("503" in statuses for statuses in listed.values())
    responses = document["paths"]["/api/v1/export"]["get"]["responses"]
    assert responses["503"]["description"] == "the store is unavailable: try again (Retry-After)"
    assert responses["403"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }


def test_a_status_the_code_raises_but_the_document_omits_is_found(
    tmp_path: Path, document: dict[str, Any]
) -> None:
    """The scan is not vacuous: a route raising a status nobody documented is reported."""
    source = (SERVER / "api.py").read_text()
    changed = source.replace(
        'return {"user": who.user, "vc": who.vc, "admin": who.admin}',
        'raise HTTPException(418, "a teapot")',
    )
    assert changed != source
    path = tmp_path / "api.py"
    path.write_text(changed)
    routes = Statuses(path).routes()
    assert routes[("get", "/api/v1/whoami")] == {"401", "418"}
    assert "418" not in documented(document)[("get", "/api/v1/whoami")]
