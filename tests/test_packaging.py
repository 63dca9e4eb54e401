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


def _requirements() -> dict:
    return _specs((ROOT / "requirements.txt").read_text().splitlines())


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return _specs(project["dependencies"] + project["optional-dependencies"]["test"])


def test_environment_yml_lists_what_requirements_txt_lists():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = _specs(conda)
    listed["torch"] = listed.pop("pytorch")  # conda-forge's name for torch
    listed.pop("python"), listed.pop("pip")
    assert listed == _requirements()
    assert pip == ["-e ."] and "-e ." in (ROOT / "requirements.txt").read_text().splitlines()


def test_pyproject_has_the_same_packages_and_floors():
    assert _pyproject() == _requirements()


def test_every_file_states_the_torch_floor():
    floor = ">=" + ".".join(map(str, course_utils.TORCH_FLOOR))
    assert _requirements()["torch"] == floor and _pyproject()["torch"] == floor


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
    assert len(chapters) == 9
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
