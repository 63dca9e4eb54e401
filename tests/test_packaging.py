"""What installs the course: requirements.txt, environment.yml, pyproject.toml, the hosted setup cell.

They must agree (same packages, same floors, the same torch floor as
``course_utils.TORCH_FLOOR``), and every chapter must open with the same setup cell.
"""

import ast
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

import course_utils

pytestmark = pytest.mark.chapter()

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


def _toml() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _project() -> dict:
    return _toml()["project"]


def _pyproject() -> dict:
    """``{package: spec}`` of the core dependencies."""
    return _specs(_project()["dependencies"])


INSTALL_LINE = "-e .[notebook,test,kubernetes]"


def test_requirements_txt_installs_pyproject_with_its_extras():
    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    assert [ln for ln in lines if ln and not ln.startswith("#")] == [INSTALL_LINE]
    assert {"notebook", "test", "kubernetes", "dev"} <= set(_project()["optional-dependencies"])


CONDA_NAME = {
    "torch": "pytorch",
    "kubernetes": "python-kubernetes",
    "universal-pathlib": "universal_pathlib",
}  # conda-forge's name where it differs from pip's


def test_environment_yml_names_each_dependency_from_conda_forge():
    """Every dependency of pyproject.toml's main list and notebook, test and kubernetes extras is a
    conda-forge package in environment.yml, under its conda-forge name with pyproject's version spec
    (or a pip line, for what conda-forge lacks); the course itself is pip's ``-e .`` with those
    extras."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    conda = _specs(d for d in env["dependencies"] if isinstance(d, str))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert conda.pop("python") == _project()["requires-python"] and conda.pop("pip") == ""
    assert pip[-1] == INSTALL_LINE
    from_pip = _specs(pip[:-1])
    wanted = dict(_pyproject())
    for extra in ("notebook", "test", "kubernetes"):
        wanted |= _specs(e.split(";")[0] for e in _project()["optional-dependencies"][extra])
    wrong = {
        name: (spec, conda.get(CONDA_NAME.get(name, name)), from_pip.get(name))
        for name, spec in wanted.items()
        if spec not in (conda.get(CONDA_NAME.get(name, name)), from_pip.get(name))
    }
    assert not wrong, f"(pyproject's spec, environment.yml's conda spec, its pip spec) differ: {wrong}"
    extra = set(conda) - {CONDA_NAME.get(n, n) for n in wanted}
    assert not extra, f"environment.yml names packages pyproject.toml does not: {sorted(extra)}"


def test_what_the_code_imports_is_declared():
    """Third-party imports of course_utils, tests and tools are in pyproject.toml (by pip name)."""
    declared = set(_pyproject())
    for extra in _project()["optional-dependencies"].values():
        declared |= set(_specs(e.split(";")[0] for e in extra))
    pip_name = {
        "yaml": "pyyaml",
        "tomli": "tomli",
        "PIL": "matplotlib",
        "packaging": "matplotlib",
        "IPython": "jupyterlab",
        "ipykernel": "jupyterlab",
        "jupyter_client": "jupyterlab",
        "nox": "nox",
        "importlinter": "import-linter",
        "upath": "universal-pathlib",
    }
    stdlib = set(sys.stdlib_module_names)
    local = {"course_utils", "conftest", "helpers"} | {
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
    # tried and skipped when absent: TorchRec (CI part 5), NVML's bindings; selenium drives a browser
    # for tools/widgets_in_browser.py, a check by hand
    optional = {"torchrec", "fbgemm-gpu", "pynvml", "psutil", "selenium"}
    missing = {k: v for k, v in found.items() if k not in declared and k not in optional}
    assert not missing, f"imported but not in pyproject.toml (package: a file importing it): {missing}"


def test_pyproject_and_environment_yml_state_the_torch_floor():
    """The matrix's floor (major.minor) is TORCH_FLOOR, pyproject's ``torch>=`` and conda's ``pytorch>=``."""
    floor = ">=" + ".".join(map(str, course_utils.TORCH_FLOOR))
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert _pyproject()["torch"] == floor and f"pytorch{floor}" in env["dependencies"]
    assert floor == ">=" + _release(_matrix()["floor"]["torch"])


def test_an_older_torch_gets_one_line_at_import():
    note = course_utils.torch_floor_note("2.7.1+cu126")
    assert note is not None and "\n" not in note and "older than 2.9" in note
    assert course_utils.torch_floor_note(_matrix()["floor"]["torch"] + "+cu128") is None
    assert course_utils.torch_floor_note(_matrix()["course"]["torch"] + "+cpu") is None
    assert course_utils.torch_floor_note("2.10.0a0+git1234") is None


def _first_code_cell(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "".join(next(c for c in cells if c["cell_type"] == "code")["source"]).rstrip("\n")


def test_every_chapter_opens_with_the_same_setup_cell():
    chapters = sorted((ROOT / "chapters").glob("*.ipynb"))
    assert {nb.name[:2] for nb in chapters} == {f"{i:02d}" for i in range(9)}  # 00-08 and appendices
    differ = [nb.name for nb in chapters if _first_code_cell(nb) != SETUP_CELL]
    assert differ == [], f"first code cell differs from templates/setup_cell.py in {differ}"


def test_the_readmes_run_the_course_command_executes_every_notebook_but_the_torchrec_ones():
    """The README's nbconvert command names its notebooks by glob: a new appendix must match one."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = [line for line in readme.splitlines() if "jupyter nbconvert" in line and "--execute" in line]
    patterns = [word for word in command.split() if word.startswith("chapters/")]
    executed = {nb.name for pattern in patterns for nb in ROOT.glob(pattern)}
    needs_torchrec = {"07a_torchrec.ipynb", "07b_planner_at_scale.ipynb"}  # the README says how to run them
    assert executed == {nb.name for nb in (ROOT / "chapters").glob("*.ipynb")} - needs_torchrec


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


@pytest.mark.launches
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


def test_an_appendix_installs_its_extra_and_only_what_applies_to_this_python(monkeypatch):
    """``install_extra`` (appendix 08a's first cell on Colab or Kaggle) installs the extra's
    missing packages with pip, skips what another Python needs (the site extra's tomli), and
    refuses an extra the course does not declare in one line."""
    from importlib import metadata

    from course_utils.notebook import hosted

    real = metadata.version

    def version(name):  # this machine, without moto, s3fs and sphinx
        if name.lower() in ("moto", "s3fs", "sphinx"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    installed = []
    monkeypatch.setattr(hosted, "_pip_install", installed.append)
    hosted.install_extra("kubernetes")
    wanted = [
        spec
        for spec in _project()["optional-dependencies"]["kubernetes"]
        if spec.startswith(("s3fs", "moto"))
    ]
    assert installed == [wanted] and len(wanted) == 2
    site = hosted.missing_requirements("site")
    assert site[0].startswith("sphinx") and not any(s.startswith("tomli") for s in site) == (
        sys.version_info >= (3, 11)
    )
    with pytest.raises(ValueError, match="the course has no extra 'nope'; it has \\['dev', 'kubernetes'"):
        hosted.install_extra("nope")


def _matrix() -> dict:
    """pyproject.toml's ``[tool.course.matrix]``: every version the course is installed, tested or
    linted with (tools/matrix.py prints one for shell)."""
    return _toml()["tool"]["course"]["matrix"]


def _release(version: str) -> str:
    """``2.9.1`` -> ``2.9``: the release a floor like ``torch>=2.9`` names."""
    return ".".join(version.split(".")[:2])


_V = r"(\d+\.\d+(?:\.\d+)?)"  # a version, two or three parts
_V3 = r"(\d+\.\d+\.\d+)"  # a version, three parts


def _pin_rules(m: dict) -> list[tuple[re.Pattern, set[str], str]]:
    """``(pattern, the values it may capture, what the matrix calls it)``: pins, then the prose forms
    that state the matrix (a release named with its role: the floor, Colab's pair, the course's torch)."""
    torches = {t["torch"] for t in m.values() if isinstance(t, dict) and "torch" in t}
    torchrec = dict(p.split("==") for p in m["torchrec"]["no-deps"] + m["torchrec"]["deps"])
    env = dict(e.split("=") for e in m["floor"]["env"])

    def either(version: str) -> set[str]:  # the full version or its release
        return {version, _release(version)}

    rules = [
        (r"(?<![\w-])torch==" + _V, torches, "torches"),
        (r"(?<![\w-])ruff==" + _V, {m["ruff"]}, "ruff"),
        (r"(?<![\w-])import-linter==" + _V, {m["import-linter"]}, "import-linter"),
        (r"(?<![\w-])(?:py)?torch>=" + _V, {_release(m["floor"]["torch"])}, "floor.torch, as major.minor"),
        (r"(?<![\w-])torch[\s`(]{1,3}" + _V3 + r"(?![\d.])", torches, "torches"),
        (_V + r"[\s,)]{1,3}(?:is\s+)?\(?the floor\b", either(m["floor"]["torch"]), "floor.torch"),
        (r"Colab['’]s pair.{0,40}?Python\s+" + _V, {m["colab"]["python"]}, "colab.python"),
        (r"Colab['’]s (?:pair.{0,60}?)?torch\W{1,3}" + _V, either(m["colab"]["torch"]), "colab.torch"),
        (r"Kaggle['’]s torch\W{1,3}" + _V, either(m["kaggle"]["torch"]), "kaggle.torch"),
        (r"the course['’]s\W{1,3}torch\W{1,3}" + _V, either(m["course"]["torch"]), "course.torch"),
        (r"TorchRec\s+" + _V3 + r"\s+beside", {torchrec["torchrec"]}, "torchrec's pin"),
    ]
    rules += [(rf"(?<![\w-]){re.escape(n)}==" + _V, {v}, f"{n}'s pin") for n, v in torchrec.items()]
    rules += [(rf"\b{k}=(\w+)", {v}, f"floor.env's {k}") for k, v in env.items()]
    return [(re.compile(p), allowed, name) for p, allowed, name in rules]


_TEXT = {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".sh", ".ipynb", ".sbatch", ".js", ".css"}
_NOT_SOURCE = {"build", "dist", "data", "__pycache__", "node_modules"}


def _source_files():
    """The repository's text files: what git tracks, less what .gitignore keeps out (venvs, builds);
    walked without git, so the check runs from any copy of the checkout."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _NOT_SOURCE and not d.endswith(".egg-info") and (not d.startswith(".") or d == ".ci")
        )
        here = Path(folder)
        for name in sorted(files):
            if Path(name).suffix in _TEXT or here.name == ".ci":
                yield here / name


def _lines(path: Path):
    """``(where, line)`` for each line a reader maintains: a notebook's cell sources (its outputs are
    records of a run) and, in README.md, everything but the "Tested on" table's rows."""
    rel = path.relative_to(ROOT).as_posix()
    if path.suffix == ".ipynb":
        for c, cell in enumerate(json.loads(path.read_text())["cells"]):
            for n, line in enumerate("".join(cell["source"]).splitlines(), 1):
                yield f"{rel} cell {c} line {n}", line
        return
    tested_on = False
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if rel == "README.md" and line.startswith("#"):
            tested_on = line.lstrip("#").strip() == "Tested on"
        if not (tested_on and line.startswith("|")):
            yield f"{rel}:{n}", line


def test_every_pin_in_the_repository_is_the_matrix():
    """Every version pin in the repository's text (code, configuration, docs, notebook cells) is the
    one pyproject.toml's ``[tool.course.matrix]`` holds: ``torch==``, ``ruff==``, TorchRec's set
    (``torchrec==``, ``fbgemm-gpu-cpu==`` and the packages installed beside them), the floor as
    ``torch>=`` (``pytorch>=`` in environment.yml) and its instruction-set flags, and prose that names
    a release with its role ("torch X.Y.Z, the floor", "Colab's pair, Python X.Y with torch X.Y.Z",
    "Kaggle's torch (X.Y)", "TorchRec X.Y.Z beside", "the course's torch X.Y.Z"). A full torch
    version in prose ("torch X.Y.Z") must be one of the matrix's torches.

    Left out, as records of runs rather than statements of the matrix: the README's "Tested on"
    table (each row names the torch that ran) and notebook outputs. A release named in two parts
    without a role ("in torch 2.11 and 2.13", "12 of 36 runs on 2.11"), a feature's first release
    ("torch >= 2.12 takes --shutdown-timeout") and another TorchRec ("torchrec 1.9.2 does not load")
    speak of that release, not of the matrix, and are not checked. Where code needs the course's own
    torch it reads the matrix (noxfile.py, .ci/run, tools/other_torch.sh), so moving the course to
    another torch is one line.
    """
    rules = _pin_rules(_matrix())
    may_pin = re.compile(r"\d\.\d|_CAPABILITY=|_INSTRUCTIONS=")  # every rule's match has one
    wrong = []
    for path in _source_files():
        for where, line in _lines(path):
            for pattern, allowed, name in rules if may_pin.search(line) else ():
                for found in pattern.finditer(line):
                    if found.group(1) not in allowed:
                        wrong.append(f"{where}: {found.group(0)!r}; the matrix's {name}: {sorted(allowed)}")
    assert not wrong, "pins that differ from pyproject.toml's [tool.course.matrix]:\n" + "\n".join(wrong)


def test_pre_commit_runs_the_matrix_ruff():
    """pre-commit cannot read TOML: each hook that runs ruff pins the matrix's ruff, and a hook
    repository of ruff's (if one is used) is at the matching tag."""
    ruff = _matrix()["ruff"]
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [(repo, hook) for repo in config["repos"] for hook in repo["hooks"]]
    ruff_hooks = [
        (repo, hook) for repo, hook in hooks if "ruff" in hook.get("entry", "") or "ruff" in repo["repo"]
    ]
    assert ruff_hooks, "no ruff hook in .pre-commit-config.yaml"
    for repo, hook in ruff_hooks:
        if repo["repo"] == "local":
            assert hook["additional_dependencies"] == [f"ruff=={ruff}"], hook["id"]
        else:
            assert repo["rev"] == f"v{ruff}", repo["repo"]


def test_tools_matrix_prints_one_value_or_one_line_naming_the_keys(capsys):
    """tools/matrix.py, what shell reads the matrix with: a value, a list as words, and an unknown
    key as one line on stderr (exit 2) that names the keys there are."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("matrix_tool", ROOT / "tools" / "matrix.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    m = _matrix()
    assert tool.main(["course.torch"]) == 0 and capsys.readouterr().out == m["course"]["torch"] + "\n"
    assert tool.main(["floor.env"]) == 0 and capsys.readouterr().out.split() == m["floor"]["env"]
    for bad in ("floor", "colab.cuda", "nope"):
        assert tool.main([bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and repr(bad) in err and "course.torch" in err
