"""No rank leaves a gloo group it has only just joined.

``dist.init_process_group`` returns in a rank once *that rank's* connections to its peers are up,
not once every rank's are: PyTorch waits for the others at the end of it only when
``TORCH_DIST_INIT_BARRIER=1`` (``_is_barrier_after_init`` in ``torch/distributed/distributed_c10d.py``;
the default is 0). A rank that calls ``destroy_process_group`` (or exits) straight after can close
a connection a slower peer is still setting up, and the peer fails in ``init_process_group`` with
gloo's "connectFullMesh failed ... Connection closed by peer". On a loaded 2-core machine, 6 of
150 launches of such a two-rank function failed that way; with a ``dist.barrier()`` before the
destroy, none of 150 did. A real program meets its peers in its collectives first; a function
that only joins and leaves must meet them in a barrier.

Read with ``ast`` (``helpers.course_code``): in every function of the course, its notebooks and its
tests (and every cell's own top-level code), the calls between ``init_process_group`` and a later
``destroy_process_group`` must include one that is not a local question (``QUERIES``).
"""

from __future__ import annotations

import ast

import pytest
from helpers.course_code import sources

pytestmark = pytest.mark.chapter(0, 2)

#: Calls that answer from this rank's own state, without meeting any other rank.
QUERIES = {
    "get_rank",
    "get_world_size",
    "get_backend",
    "is_initialized",
    "timedelta",
    "type",
    "str",
    "int",
    "len",
    "split",
    "print",
}

#: ``{(file, function): why it may join and leave without meeting}``; every entry must still
#: match (``test_allow_list_has_no_stale_entry``).
ALLOWED = {
    ("chapters/02a_collectives_in_depth.ipynb", "nccl_here"): (
        "launched with world_size=1 to see whether NCCL starts at all: a group of one has no peer "
        "whose connection could be cut"
    ),
}


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _own_calls(body: list[ast.stmt]) -> list[ast.Call]:
    """The calls in ``body`` in source order, leaving out those inside nested functions and classes."""
    calls, todo = [], list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(calls, key=lambda call: (call.lineno, call.col_offset))


def leaves_without_meeting(tree: ast.Module) -> list[str]:
    """The functions of ``tree`` (``"<cell>"`` for its top-level code) that call
    ``init_process_group``, then ``destroy_process_group``, with only ``QUERIES`` in between."""
    scopes = [("<cell>", tree.body)] + [
        (node.name, node.body)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    found = []
    for name, body in scopes:
        names = [_call_name(call) for call in _own_calls(body)]
        if "init_process_group" not in names or "destroy_process_group" not in names:
            continue
        start = names.index("init_process_group")
        end = len(names) - 1 - names[::-1].index("destroy_process_group")
        if start < end and all(between in QUERIES for between in names[start + 1 : end]):
            found.append(name)
    return found


@pytest.fixture(scope="module")
def found() -> dict[tuple[str, str], str]:
    """``{(file, function): where}`` for every function that leaves without meeting."""
    return {
        (file, name): f"{file} {where}{name}"
        for file, pieces in sources(tests=True).items()
        for where, tree in pieces
        for name in leaves_without_meeting(tree)
    }


def test_every_rank_meets_its_peers_before_it_leaves_the_group(found):
    unexplained = [where for key, where in found.items() if key not in ALLOWED]
    assert not unexplained, (
        "these functions leave a group they have only just joined; put a dist.barrier() before "
        f"destroy_process_group (this file's docstring says why): {unexplained}"
    )


def test_allow_list_has_no_stale_entry(found):
    assert not set(ALLOWED) - set(found), set(ALLOWED) - set(found)


@pytest.mark.parametrize(
    ("code", "names"),
    [
        (
            "def f():\n    dist.init_process_group('gloo')\n    r = dist.get_rank()\n"
            "    dist.destroy_process_group()\n    return r",
            ["f"],
        ),
        (
            "def f():\n    dist.init_process_group('gloo')\n    r = dist.get_rank()\n    dist.barrier()\n"
            "    dist.destroy_process_group()\n    return r",
            [],
        ),
        (
            "def f():\n    dist.init_process_group('gloo')\n    train(model)\n"
            "    dist.destroy_process_group()",
            [],
        ),
        ("dist.init_process_group('gloo')\ndist.destroy_process_group()", ["<cell>"]),
        (  # a nested function's barrier is not the outer function's meeting
            "def f():\n    dist.init_process_group('gloo')\n    def g():\n        dist.barrier()\n"
            "    dist.destroy_process_group()",
            ["f"],
        ),
        ("def f():\n    dist.destroy_process_group()\n    dist.init_process_group('gloo')", []),
    ],
)
def test_the_scan_finds_what_it_should(code, names):
    assert leaves_without_meeting(ast.parse(code)) == names
