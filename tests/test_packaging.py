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
        "importlinter": "import-linter",
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


def _setup_commands() -> list[tuple[list[str], dict]]:
    """What the setup cell would run: each ``subprocess.run`` call's command and keywords, read
    from its code (every argument a literal, but ``sys.executable``)."""
    found = []
    for node in ast.walk(ast.parse(SETUP_CELL)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "subprocess.run":
            command = [
                "PYTHON" if ast.unparse(e) == "sys.executable" else ast.literal_eval(e)
                for e in node.args[0].elts
            ]
            found.append((node.lineno, command, {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
    return [(command, keywords) for _, command, keywords in sorted(found, key=lambda f: f[0])]


def test_the_setup_cell_installs_the_pinned_release_from_pyprojects_repository():
    """The cell installs ``name @ git+<[project.urls] Repository>@v<version>`` (the release tag), with
    ``--`` before it, timeouts on pip's connections and on each command, the image's torch kept
    (``--no-deps``), then lets the package check the release and add what the image lacks."""
    project = _project()
    install, check = _setup_commands()
    release = f"{project['name']} @ git+{project['urls']['Repository']}@v{project['version']}"
    assert install[0] == [
        "PYTHON",
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--timeout",
        "60",
        "--",
        release,
    ]
    assert check[0] == ["PYTHON", "-m", "course_utils.notebook.hosted", project["version"]]
    assert install[1] == check[1] == {"check": True, "timeout": 900}


def test_the_setup_cell_is_three_plain_statements():
    lines = SETUP_CELL.splitlines()
    statements = ast.parse(SETUP_CELL).body
    assert len(lines) == len(statements) <= 3 and ";" not in SETUP_CELL.split("#")[0]
    assert all(isinstance(s, (ast.Import, ast.Expr, ast.Assign)) for s in statements)
    assert "exec(" not in SETUP_CELL and "eval(" not in SETUP_CELL


def _run_setup_cell(monkeypatch, tmp_path, installed: bool) -> list:
    import importlib.util
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    if not installed:
        real = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name: None if name == "course_utils" else real(name)
        )
    monkeypatch.chdir(tmp_path)
    exec(compile(SETUP_CELL, "setup_cell", "exec"), {})
    return [[Path(c).name if c == sys.executable else c for c in cmd] for cmd in calls]


def test_where_the_course_is_installed_the_setup_cell_only_checks_the_release(tmp_path, monkeypatch):
    calls = _run_setup_cell(monkeypatch, tmp_path, installed=True)
    assert [c[1:3] for c in calls] == [["-m", "course_utils.notebook.hosted"]]
    assert list(tmp_path.iterdir()) == []  # no clone, no file
    import subprocess

    monkeypatch.undo()  # the check itself, for real: silent, since this checkout is that release
    done = subprocess.run(
        [sys.executable, "-m", "course_utils.notebook.hosted", _project()["version"]],
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_where_the_course_is_missing_the_setup_cell_installs_then_checks(tmp_path, monkeypatch):
    calls = _run_setup_cell(monkeypatch, tmp_path, installed=False)
    assert [c[2] for c in calls] == ["pip", "course_utils.notebook.hosted"]


def test_another_installed_release_is_refused_in_one_line_naming_the_fix(capsys):
    from course_utils.notebook import hosted

    assert hosted.main(["9.9.9"]) == 1
    err = capsys.readouterr().err
    project = _project()
    assert err.count("\n") == 1 and f"belongs to release 9.9.9 of the course, and {project['version']}" in err
    assert f"git+{project['urls']['Repository']}@v9.9.9" in err


def test_the_setup_check_installs_what_is_missing_but_never_torch(monkeypatch):
    from importlib import metadata

    from course_utils.notebook import hosted

    real = metadata.version

    def version(name):  # this machine, without pandas, pyarrow and torch
        if name in ("pandas", "pyarrow", "torch"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    assert hosted.missing_requirements() == [
        f"pandas{_pyproject()['pandas']}",
        f"pyarrow{_pyproject()['pyarrow']}",
    ]
