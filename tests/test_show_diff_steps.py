"""Each step the course builds on the last is printed as a change of it: a ``show_diff(before,
after)`` call in the chapter that teaches the step, whose stored output is a unified diff (lines
that go, lines that come). Reads the notebooks only; runs nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"

STEPS = [  # (notebook, before, after): the step, as the chapter's show_diff call names the two
    ("04_ddp.ipynb", "one_process.main", "ddp_canonical.main"),  # plain script -> DDP script
    ("04_ddp.ipynb", "NaiveDDP.finish_gradient_sync", "BucketedDDP.finish_gradient_sync"),
    ("06_pipeline_parallel.ipynb", "schedules.gpipe", "schedules.one_f_one_b"),
    (
        "07_hybrid_parallel_recsys.ipynb",
        "sharding.TableWiseEmbeddingBags.forward",
        "sharding.RowWiseEmbeddingBags.forward",
    ),
    (
        "08_fault_tolerance_and_scale_out.ipynb",
        "checkpoint.Checkpointer.save_blocking",
        "checkpoint.Checkpointer.save_async",
    ),
    (
        "07_hybrid_parallel_recsys.ipynb",
        "sharding.lookup_unsharded",
        "sharding.TableWiseEmbeddingBags.forward",
    ),
]

CALL = re.compile(r"^\s*show_diff\(\s*([\w.]+)\s*,\s*([\w.]+)\s*[,)]", re.MULTILINE)


def stdout(cell: dict) -> list[str]:
    """The lines a code cell printed, as stored in the notebook."""
    text = "".join("".join(o["text"]) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return text.splitlines()


def named(header: str, prefix: str, name: str) -> bool:
    """Whether a ``--- file  qualname`` (or ``+++``) line is the header of ``name``'s source."""
    if not header.startswith(prefix + " "):
        return False
    qualname = header.rsplit("  ", 1)[-1]
    return name == qualname or name.endswith("." + qualname)


def printed_diff(lines: list[str], before: str, after: str) -> list[str]:
    """The body of the diff of ``before`` against ``after`` among a cell's printed lines ([] if none)."""
    for i in range(len(lines) - 1):
        if named(lines[i], "---", before) and named(lines[i + 1], "+++", after):
            body = []
            for line in lines[i + 2 :]:
                if line.startswith(("--- ", "# ")) or not line.startswith((" ", "-", "+", "@@")) and line:
                    break  # the next diff, or a show_source after this one
                body.append(line)
            return body
    return []


@pytest.mark.parametrize("notebook, before, after", STEPS, ids=lambda v: v if "." in v else None)
def test_each_step_is_shown_as_a_diff_of_the_last(notebook, before, after):
    cells = json.loads((CHAPTERS / notebook).read_text(encoding="utf-8"))["cells"]
    calls = [
        cell
        for cell in cells
        if cell["cell_type"] == "code" and (before, after) in CALL.findall("".join(cell["source"]))
    ]
    assert calls, f"{notebook}: no code cell calls show_diff({before}, {after}, ...)"
    for cell in calls:
        body = printed_diff(stdout(cell), before, after)
        assert body and body[0].startswith("@@"), f"{notebook}: no stored diff of {before} -> {after}"
        assert any(line.startswith("-") for line in body), f"{notebook}: {before} -> {after} removes nothing"
        assert any(line.startswith("+") for line in body), f"{notebook}: {before} -> {after} adds nothing"
