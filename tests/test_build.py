"""The build's choice (setup.py): compiled where a C compiler and Python's headers are present,
pure Python where they are not, for an editable install and with CORRAL_COMPILE=0; and a module
that fails to compile leaves the whole package pure Python. The compiled build itself, and that
it decides as the sources do: tests/sim/test_compiled.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from setuptools import Distribution, Extension

from tests.building import compiler_and_headers, source_copy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_py() -> ModuleType:
    """setup.py as a module (its `main` runs only as a script)."""
    spec = importlib.util.spec_from_file_location("corral_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_compiles_where_a_compiler_and_headers_are(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not compiler_and_headers():
        pytest.skip("no C compiler or Python headers here")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    assert setup_py._why_pure("") is None


def test_pure_python_when_asked_or_editable(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    assert setup_py._why_pure("0") == "CORRAL_COMPILE=0"
    for command in ("editable_wheel", "develop"):
        monkeypatch.setattr(sys, "argv", ["setup.py", command, "--dist-dir", "/tmp/x"])
        assert setup_py._why_pure("") == "an editable install keeps its sources authoritative"


def test_pure_python_without_a_compiler_or_headers(
    setup_py: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "argv", ["setup.py", "bdist_wheel"])
    monkeypatch.setenv("CC", f"{tmp_path}/no-cc -pthread")
    assert setup_py._why_pure("") == f"no C compiler: {tmp_path}/no-cc not found"
    monkeypatch.setenv("CC", sys.executable)  # any program found on disk stands for the compiler
    monkeypatch.setattr(setup_py.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    assert setup_py._why_pure("") == (
        f"no Python headers: {tmp_path}/Python.h not found (python3-dev)"
    )


def _build_ext(command: type, tmp_path: Path) -> list[str]:
    """Runs `command` (a build_ext) in place on two extensions, the first good, the second not C;
    returns the names of the extension files it leaves (in place, or in the build folder)."""
    (tmp_path / "good.c").write_text(
        "#include <Python.h>\n"
        'static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "good", 0, -1, 0};\n'
        "PyMODINIT_FUNC PyInit_good(void) { return PyModule_Create(&m); }\n"
    )
    (tmp_path / "bad.c").write_text("this is not C;\n")
    distribution = Distribution(
        {
            "name": "probe",
            "ext_modules": [Extension("good", ["good.c"]), Extension("bad", ["bad.c"])],
            "cmdclass": {"build_ext": command},
            "script_args": ["build_ext", "--inplace", "--build-temp", str(tmp_path / "temp")],
        }
    )
    distribution.parse_command_line()
    try:
        distribution.run_commands()
    finally:
        built = sorted(path.name.partition(".")[0] for path in tmp_path.rglob("*.so"))
    return built


@pytest.mark.skipif(not compiler_and_headers(), reason="no C compiler or Python headers here")
def test_a_failed_module_leaves_all_of_them_pure(
    setup_py: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    # good.c is built first and then removed: the compiled modules are all of them or none
    assert _build_ext(setup_py._BuildExtOrPure, tmp_path) == []
    assert "corral: pure Python build (compiling the core failed:" in capsys.readouterr().err


@pytest.mark.skipif(not compiler_and_headers(), reason="no C compiler or Python headers here")
def test_a_failed_module_fails_the_build_asked_to_compile(
    setup_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match="bad"):
        _build_ext(setup_py.build_ext, tmp_path)
    # the good one was built before the bad one failed (the test above then proves its removal)
    assert [path.name.partition(".")[0] for path in tmp_path.rglob("*.so")] == ["good"]


def _wheel(tmp_path: Path, compile_value: str) -> subprocess.CompletedProcess[str]:
    source = source_copy(tmp_path / "src")
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(tmp_path / "wheel"), str(source)],
        env={**os.environ, "CORRAL_COMPILE": compile_value},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_corral_compile_0_builds_the_pure_package(tmp_path: Path) -> None:
    built = _wheel(tmp_path, "0")
    assert built.returncode == 0, built.stderr[-3000:]
    assert "corral: pure Python build (CORRAL_COMPILE=0)" in built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("corral-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "corral/core/scheduler.py" in names
    assert not [name for name in names if name.endswith((".so", ".pyd"))]


def test_a_bad_corral_compile_is_refused_in_one_line(tmp_path: Path) -> None:
    built = _wheel(tmp_path, "yes")
    assert built.returncode != 0
    assert "CORRAL_COMPILE=yes: say 1 (compile), 0 (pure Python) or leave it unset" in (
        built.stdout + built.stderr
    )
    assert not (tmp_path / "wheel").exists() or not list((tmp_path / "wheel").iterdir())
