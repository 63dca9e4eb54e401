"""What installs the course: requirements.txt, environment.yml, pyproject.toml, the hosted setup cell.

They must agree (same packages, same floors, the same torch floor as
``course_utils.TORCH_FLOOR``), and every chapter must open with the same setup cell.
"""

import ast
import json
import re
import sys
from pathlib import Path

import yaml

import course_utils

ROOT = Path(__file__).resolve().parents[1]
SETUP_CELL = (ROOT / "templates" / "setup_cell.py").read_text().rstrip("\n")
_SPEC = re.compile(r"^([A-Za-z0-9_.-]+)\s*(.*)$")


def _specs(lines) -> dict:
    """``{package: version spec}`` from requirement lines (comments, options and ``-e .`` left out)."""
    found = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            name, spec = _SPEC.match(line).groups()
            found[name.lower()] = spec.replace(" ", "")
    return found


def _project() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pyproject() -> dict:
    """``{package: spec}`` of the core dependencies."""
    return _specs(_project()["dependencies"])


INSTALL_LINE = "-e .[notebook,test]"


def test_requirements_txt_installs_pyproject_with_its_extras():
    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")] == [INSTALL_LINE]
    assert {"notebook", "test", "dev"} <= set(_project()["optional-dependencies"])


def test_environment_yml_installs_conda_torch_then_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = _specs(d for d in env["dependencies"] if isinstance(d, str))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert conda.pop("pytorch") == _pyproject()["torch"]  # conda-forge's name for torch, same floor
    assert set(conda) == {"python", "pip"} and pip == [INSTALL_LINE]


def test_what_the_code_imports_is_declared():
    """Third-party imports of course_utils, tests and tools are in pyproject.toml (by pip name)."""
    declared = set(_pyproject())
    for extra in _project()["optional-dependencies"].values():
        declared |= set(_specs(e.split(";")[0] for e in extra))
    pip_name = {
        "yaml": "pyyaml",
        "tomli": "tomli",
        "PIL": "matplotlib",
        "IPython": "jupyterlab",
        "ipykernel": "jupyterlab",
        "jupyter_client": "jupyterlab",
        "nox": "nox",
    }
    stdlib = set(sys.stdlib_module_names)
    local = {"course_utils", "conftest"} | {
        p.stem for p in [*ROOT.glob("tests/**/*.py"), *ROOT.glob("tools/*.py")]
    }
    found = {}
    for path in [*ROOT.glob("course_utils/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("tools/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top not in local:
                    found.setdefault(pip_name.get(top, top).lower().replace("_", "-"), path.name)
    # tried and skipped when absent: TorchRec (CI part 4), NVML's bindings; selenium drives a browser
    # for tools/widgets_in_browser.py, a check by hand
    optional = {"torchrec", "fbgemm-gpu", "pynvml", "psutil", "selenium"}
    missing = {k: v for k, v in found.items() if k not in declared and k not in optional}
    assert not missing, f"imported but not in pyproject.toml (package: a file importing it): {missing}"


def test_pyproject_and_environment_yml_state_the_torch_floor():
    floor = ">=" + ".".join(map(str, course_utils.TORCH_FLOOR))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert _pyproject()["torch"] == floor and f"pytorch{floor}" in env["dependencies"]


def test_an_older_torch_gets_one_line_at_import():
    note = course_utils.torch_floor_note("2.7.1+cu126")
    assert note is not None and "\n" not in note and "older than 2.9" in note
    assert course_utils.torch_floor_note("2.9.1+cu128") is None
    assert course_utils.torch_floor_note("2.13.0+cpu") is None
    assert course_utils.torch_floor_note("2.10.0a0+git1234") is None


def _first_code_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"]).rstrip("\n")


def test_every_chapter_opens_with_the_same_setup_cell():
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    assert {nb.name[:2] for nb in chapters} == {f"{i:02d}" for i in range(9)}  # 00-08 and appendices
    differ = [nb.name for nb in chapters if _first_code_cell(nb) != SETUP_CELL]
    assert differ == [], f"first code cell differs from templates/setup_cell.py in {differ}"


def test_the_setup_cell_keeps_the_image_torch_and_installs_what_else_is_needed():
    calls = [node for node in ast.walk(ast.parse(SETUP_CELL)) if isinstance(node, ast.List)]
    commands = [[ast.literal_eval(e) for e in c.elts if isinstance(e, ast.Constant)] for c in calls]
    installs = [c for c in commands if "install" in c]
    assert installs[0][-3:] == ["--no-deps", "-e", "course"]  # the course, without its deps
    extra = _specs(installs[1][installs[1].index("-q") + 1 :])  # then the rest, never torch
    wanted = {k: v for k, v in _pyproject().items() if k != "torch"}
    core = {k: wanted[k] for k in extra}
    assert "torch" not in extra and extra == core
    assert set(extra) == {"cloudpickle", "numpy", "pandas", "pyarrow", "matplotlib"}


def test_the_setup_cell_does_nothing_where_the_course_is_installed(tmp_path, monkeypatch):
    """Run twice here (course_utils importable): no clone, no pip, no error, either time."""
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(SETUP_CELL, "setup_cell", "exec"), {})
    assert calls == [] and list(tmp_path.iterdir()) == []


def test_a_failed_clone_says_what_to_do(tmp_path, monkeypatch):
    import importlib.util
    import subprocess

    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 128, "", "fatal: unable to access: Could not resolve host")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(SETUP_CELL, "setup_cell", "exec"), {})
    except RuntimeError as exc:
        message = str(exc)
    else:
        raise AssertionError("a failed clone must raise")
    assert "Could not resolve host" in message and "%env COURSE_REPO=" in message and "Internet" in message
