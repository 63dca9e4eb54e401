"""Every private torch API the course uses goes through ``course_utils/runtime/compat.py``.

A private name (``torch.cuda._is_compiled``, ``import torch._dynamo``, a schedule's
``_calculate_single_rank_operations``) can change or vanish in any torch release; kept in one
file, each with a docstring saying what it wraps and on which versions, a new torch breaks one
place, and the place says why the course needs it.

Read with ``ast``: every ``.py`` file under ``course_utils/`` (but compat.py) and the code cells
of ``chapters/*.ipynb`` and ``solutions/*.ipynb``. Tests and benchmarks may use private names;
they are not read. A *use* is:

* an import of a private module or name: ``import torch._dynamo``, ``from torch._x import y``,
  ``from torch.x import _y``;
* a private attribute (``_name``, not a dunder) on something imported from torch:
  ``torch.cuda._device_count_nvml()``, ``DDP._set_params_and_buffers_to_ignore_for_model``;
* a private attribute on any other object (a variable, ``self``, ``super()``, a call's result)
  when the course itself defines no such name: ``schedule._n_microbatches``,
  ``module._parameters``. ``self._bags`` is the course's own (a ``def _bags`` or a
  ``self._bags = ...`` somewhere in the course), ``os._exit`` is not torch's (``os`` is not
  imported from torch), ``record._replace`` is namedtuple's (``NOT_TORCH``);
* ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` with a private name, read as the attribute;
* an override: a private method, defined in a class derived from a torch class, that the torch
  class has (``Stage._get_init_p2p_neighbors_ops``), and ``super()._name`` calls in it.

The course's own private names that torch also has (``BucketedDDP._rebuild_buckets`` is the
course's: it rebuilds the course's buckets, never calls torch's ``Reducer``) count as the course's,
except on something imported from torch, and except overrides.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass

import pytest
from helpers.course_code import sources

pytestmark = pytest.mark.chapter()

COMPAT = "course_utils/runtime/compat.py"

#: ``{(file, private name): why it stays outside compat.py}``. Every entry must still be used
#: (``test_allow_list_has_no_stale_entry``), so that fixing a place also removes its entry.
ALLOWED = {
    ("course_utils/runtime/cluster/group.py", "_allgather_base"): (
        "ModeledGroup, a Python ProcessGroup, overrides the method dist.all_gather_into_tensor calls "
        "on a group, so that the flat all-gather (FSDP's, DTensor's) is timed on the modeled "
        "network too; an override has to be defined on the subclass. Its call into gloo goes "
        "through compat."
    ),
    ("course_utils/runtime/cluster/group.py", "_reduce_scatter_base"): (
        "ModeledGroup overrides the method dist.reduce_scatter_tensor calls on a group (as for "
        "_allgather_base); its call into gloo goes through compat."
    ),
    ("course_utils/pipeline/torch_pipelining.py", "_get_init_p2p_neighbors_ops"): (
        "Stage subclasses PipelineStage to override the method PipelineStage calls to build its "
        "handshake with its neighbours; an override has to be defined on the subclass. "
        "versions.fix_init_handshake holds the version-dependent part (torch 2.9's int64 scalar), "
        "and the override exists only where PipelineStage has the method."
    ),
}

#: Private names of the standard library's public API, on objects of unknown type.
NOT_TORCH = {
    "_asdict": "namedtuple",
    "_replace": "namedtuple",
    "_fields": "namedtuple",
    "_make": "namedtuple",
    "_field_defaults": "namedtuple",
}


def is_private(name: str) -> bool:
    """``_x`` and ``_x_``, not ``__x__`` (dunders are Python's) nor ``_`` alone."""
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Use:
    file: str
    line: str  # "12" or "cell 15 line 3"
    name: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.name} in {self.code}"


def _root(node: ast.AST) -> ast.AST:
    """The start of an attribute chain: ``torch`` in ``torch.cuda._x()``, ``super()`` in ``super()._x``."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "super"):
            node = node.func
        else:
            return node


def imported_names(trees: list[ast.Module]) -> tuple[dict[str, str], set[str]]:
    """``({name: dotted torch object it is bound to}, {names imported from other libraries})``;
    names imported from the course itself are in neither: what they reach is checked like a
    variable's (``versions._LACK_ALL_TO_ALL`` is the course's, ``Stage._x`` may be torch's)."""
    torch_names, other = {}, set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if alias.name.split(".")[0] == "torch":
                        torch_names[bound] = alias.name if alias.asname else bound
                    elif alias.name.split(".")[0] != "course_utils":
                        other.add(bound)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if node.level == 0 and node.module.split(".")[0] == "torch":
                        torch_names[bound] = f"{node.module}.{alias.name}"
                    elif node.level == 0 and node.module.split(".")[0] != "course_utils":
                        other.add(bound)
    return torch_names, other - set(torch_names)


def resolve(dotted: str):
    """The object ``torch.a.b.C`` names (importing what it takes), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for part in parts[cut:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _class_methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    """The methods a class body defines, also under ``if`` / ``try`` at class level."""
    found, todo = [], list(cls.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(stmt)
        elif isinstance(stmt, ast.If | ast.Try | ast.With):
            todo += [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", [])]
    return found


class Course:
    """What the course defines across all the files read: its private names and its classes."""

    def __init__(self, files: dict[str, list[tuple[str, ast.Module]]]):
        self.defined: set[str] = set()
        self.classes: dict[str, tuple[list[str], dict[str, str]]] = {}  # name -> (bases, torch names)
        for pieces in files.values():
            trees = [tree for _, tree in pieces]
            torch_names, _ = imported_names(trees)
            for tree in trees:
                for node in ast.walk(tree):
                    self._note_definition(node)
                    if isinstance(node, ast.ClassDef):
                        self.classes[node.name] = ([_dotted(b) or "" for b in node.bases], torch_names)
        self.overrides = {name for pieces in files.values() for name in self._overrides(pieces)}
        self.defined -= self.overrides

    def _note_definition(self, node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            self.defined.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                self.defined.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "register_buffer" and node.args and isinstance(node.args[0], ast.Constant):
                self.defined.add(str(node.args[0].value))

    def torch_bases(self, bases: list[str], torch_names: dict[str, str], seen=()) -> list[str]:
        """The torch classes (dotted) among ``bases``, through the course's own classes."""
        found = []
        for base in bases:
            head, _, rest = base.partition(".")
            if head in torch_names:
                found.append(torch_names[head] + (f".{rest}" if rest else ""))
            elif base in self.classes and base not in seen:
                found += self.torch_bases(*self.classes[base], seen=(*seen, base))
        return found

    def _overrides(self, pieces) -> set[str]:
        torch_names, _ = imported_names([tree for _, tree in pieces])
        names = set()
        for _, tree in pieces:
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                bases = self.torch_bases([_dotted(b) or "" for b in cls.bases], torch_names)
                for method in _class_methods(cls):
                    if is_private(method.name) and bases:
                        resolved = [resolve(b) for b in bases]
                        # a base this torch lacks: count the method as an override, to be safe
                        if any(r is None or hasattr(r, method.name) for r in resolved):
                            names.add(method.name)
        return names


def _string_attribute(node: ast.Call) -> tuple[ast.AST, str] | None:
    """``(obj, "_x")`` for ``getattr(obj, "_x", ...)`` and its kin."""
    if (
        isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def private_uses(file: str, pieces: list[tuple[str, ast.Module]], course: Course) -> list[Use]:
    """The private torch names one file (or notebook) uses."""
    torch_names, other_imports = imported_names([tree for _, tree in pieces])
    uses = []
    for where, tree in pieces:

        def found(node, name, where=where):
            line = f"{where}line {node.lineno}" if where else str(node.lineno)
            uses.append(Use(file, line, name, ast.unparse(node)[:100]))

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "torch" and any(map(is_private, parts)):
                        found(node, next(p for p in parts if is_private(p)))
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                parts = node.module.split(".")
                if parts[0] == "torch":
                    for name in [*parts, *(a.name for a in node.names)]:
                        if is_private(name):
                            found(node, name)
            elif isinstance(node, ast.ClassDef):
                bases = course.torch_bases([_dotted(b) or "" for b in node.bases], torch_names)
                for method in _class_methods(node):
                    if bases and method.name in course.overrides:
                        found(method, method.name)
            else:
                name = _private_attribute(node, torch_names, other_imports, course)
                if name is not None:
                    found(node, name)
    return uses


def _private_attribute(node, torch_names, other_imports, course: Course) -> str | None:
    """The private torch name that ``node`` reads as an attribute (``x._name`` or
    ``getattr(x, "_name")``), or None: not private, or of an object that is not torch's."""
    if isinstance(node, ast.Attribute) and is_private(node.attr):
        obj, name = node.value, node.attr
    elif isinstance(node, ast.Call) and _string_attribute(node):
        obj, name = _string_attribute(node)
        if not is_private(name):
            return None
    else:
        return None
    root = _root(obj)
    root_name = root.id if isinstance(root, ast.Name) else None
    if root_name in torch_names:
        return name
    if root_name in other_imports or name in NOT_TORCH:
        return None
    return name if name not in course.defined else None


@pytest.fixture(scope="module")
def scanned() -> tuple[list[Use], Course]:
    files = sources()
    course = Course(files)
    uses = [
        use for file, pieces in files.items() if file != COMPAT for use in private_uses(file, pieces, course)
    ]
    return uses, course


def test_no_private_torch_name_outside_compat(scanned):
    uses, _ = scanned
    outside = [use for use in uses if (use.file, use.name) not in ALLOWED]
    assert not outside, (
        "private torch names outside course_utils/runtime/compat.py; give each a small function "
        "in compat.py (what it wraps, which torch versions, why) and call that:\n"
        + "\n".join(map(str, outside))
    )


def test_allow_list_has_no_stale_entry(scanned):
    uses, _ = scanned
    used = {(use.file, use.name) for use in uses}
    stale = [key for key in ALLOWED if key not in used]
    assert not stale, f"allowed but no longer used (remove these entries): {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


@pytest.mark.parametrize(
    "code, names",
    [
        ("import torch\nif not torch.cuda._is_compiled(): pass", ["_is_compiled"]),
        ("import torch\nn = torch.cuda._device_count_nvml", ["_device_count_nvml"]),
        ("import torch._dynamo", ["_dynamo"]),
        ("from torch._dynamo import config", ["_dynamo"]),
        ("from torch.distributed import _functional_collectives", ["_functional_collectives"]),
        (
            "from torch.nn.parallel import DistributedDataParallel as DDP\nDDP._set_static_graph(m)",
            ["_set_static_graph"],
        ),
        (
            "def f(schedule):\n    return schedule._calculate_single_rank_operations(0)",
            ["_calculate_single_rank_operations"],
        ),
        ("def f(m):\n    m._parameters['w'] = None", ["_parameters"]),
        ("def f(s):\n    return hasattr(s, '_add_bubbles_to_actions')", ["_add_bubbles_to_actions"]),
        (
            "from torch.distributed.pipelining import PipelineStage\n"
            "class S(PipelineStage):\n"
            "    def _get_init_p2p_neighbors_ops(self):\n"
            "        return super()._get_init_p2p_neighbors_ops()",
            ["_get_init_p2p_neighbors_ops", "_get_init_p2p_neighbors_ops"],
        ),
        ("import os\nos._exit(0)", []),
        (
            "import torch\nclass M(torch.nn.Module):\n    def _helper(self):\n        return self._helper()",
            [],
        ),
        ("def f(row):\n    return row._replace(a=1)", []),
        ("import torch\nprint(torch.__version__)", []),
    ],
)
def test_the_scan_finds_what_it_should(code, names):
    files = {"snippet.py": [("", ast.parse(code))]}
    course = Course(files)
    assert [use.name for use in private_uses("snippet.py", files["snippet.py"], course)] == names


def test_a_course_helper_named_like_a_torch_private_is_the_courses(scanned):
    """``BucketedDDP._rebuild_buckets`` rebuilds the course's buckets (torch's ``Reducer`` has a
    ``_rebuild_buckets`` too, which the course only mentions in a docstring)."""
    _, course = scanned
    assert "_rebuild_buckets" in course.defined
    assert "_get_init_p2p_neighbors_ops" in course.overrides
